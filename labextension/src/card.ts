/**
 * One cluster run in the sidebar. A card is built once per cluster id (a name comes back
 * after `down`, so a live and a stopped run may share it) and updated in place on every
 * poll, so focus, hover and the expanded state survive refreshes.
 */
import { errorMessage, ICluster } from './api';
import { renderDetail } from './details';
import { button, h, setText } from './dom';
import { ago, budgetText, budgetUsed, shape, usd, usdPerHour } from './format';
import { ClustersModel } from './model';

/** What the card's buttons do to run `id` of `name`; the sidebar routes them to the commands. */
export interface ICardActions {
  shutdown(name: string, id: number): void;
  openDashboard(name: string, id: number): void;
  insertAttach(name: string, id: number): void;
}

export class ClusterCard {
  readonly node = h('div', 'gpugeek-cluster');
  readonly id: number;
  readonly name: string;

  constructor(
    cluster: ICluster,
    private readonly _model: ClustersModel,
    actions: ICardActions
  ) {
    const { id, name } = cluster;
    this.id = id;
    this.name = name;
    this.node.dataset.name = name;
    this.node.dataset.id = String(id);

    const head = h('div', 'gpugeek-cluster-head');
    this._toggle.type = 'button';
    this._toggle.title = 'Show nodes and utilisation';
    this._toggle.setAttribute('aria-expanded', 'false');
    this._toggle.addEventListener('click', () => this._setExpanded(!this._expanded));
    head.append(this._toggle, this._backend, this._simBadge);

    const figures = h('div', 'gpugeek-cluster-figures');
    figures.append(this._shape, this._spent, this._rate);

    this._budget.append(this._budgetFill, this._budgetLabel);
    this._budget.setAttribute('role', 'progressbar');
    this._budget.setAttribute('aria-valuemin', '0');
    this._budget.setAttribute('aria-valuemax', '100');

    this._shutdown = button('gpugeek-shutdown', 'Shut down', () => actions.shutdown(name, id));
    this._dashboard = button('gpugeek-dashboard', 'Ray dashboard', () =>
      actions.openDashboard(name, id)
    );
    this._attach = button('gpugeek-attach', 'Insert attach code', () =>
      actions.insertAttach(name, id)
    );
    this._attach.title = 'Insert a cell that attaches the current notebook to this cluster';
    this._actions.append(this._shutdown, this._dashboard, this._attach);

    this._detail.hidden = true;
    this.node.append(head, this._status, this._guard, figures, this._budget, this._actions, this._detail);
  }

  /** Shows the cluster's latest figures. */
  update(cluster: ICluster): void {
    const stopping = cluster.live && this._model.isStopping(cluster.id);
    const state = stopping ? 'stopping' : cluster.state;
    const detach = cluster.detaches;
    this.node.dataset.state = state;
    this.node.classList.toggle('gpugeek-mod-stopped', !cluster.live);
    this.node.classList.toggle('gpugeek-mod-orphan', cluster.orphan);
    this.node.classList.toggle('gpugeek-mod-failed', cluster.state === 'failed');
    this.node.classList.toggle('gpugeek-mod-unwatched', cluster.watchdog_gone || Boolean(cluster.guard_failing));

    setText(this._toggle, cluster.name);
    setText(this._backend, cluster.backend);
    this._simBadge.hidden = !cluster.simulated;
    setText(this._status, Private.status(cluster, stopping));
    this._guard.hidden = !cluster.live;
    this._guard.dataset.by = cluster.guard_by ?? 'none';
    setText(
      this._guard,
      cluster.guarded_by
        ? `guarded by ${cluster.guarded_by}`
        : 'guarded by nothing: budget and idle stop are not enforced'
    );

    this._shape.hidden = !cluster.live;
    setText(this._shape, shape(cluster));
    setText(this._spent, usd(cluster.spent_usd));
    this._rate.hidden = !cluster.live;
    setText(this._rate, usdPerHour(cluster.usd_per_hour));
    this._spent.title = cluster.live ? 'Spent so far' : 'Final cost';

    this._updateBudget(cluster);

    this._actions.hidden = !cluster.live;
    // The server decides (409 with its reason when it cannot): a starting or stopping claim
    // left behind by a dead process may be stale, so only our own stop in flight disables it.
    this._shutdown.disabled = stopping;
    setText(
      this._shutdown,
      stopping ? (detach ? 'detaching…' : 'stopping…') : detach ? 'Detach' : 'Shut down'
    );
    this._shutdown.title = Private.shutdownTitle(cluster, detach);
    this._dashboard.disabled = !cluster.dashboard_url;
    this._dashboard.title = cluster.dashboard_url
      ? `Open ${cluster.dashboard_url} in a new tab`
      : "This cluster was started without Ray's dashboard";
    this._attach.disabled = !cluster.attach_code;

    if (this._expanded) {
      void this._loadDetail();
    }
  }

  dispose(): void {
    this.node.remove();
  }

  private _updateBudget(cluster: ICluster): void {
    const text = budgetText(cluster);
    const used = budgetUsed(cluster);
    this._budget.hidden = text === null;
    if (text === null || used === null) {
      return;
    }
    const pct = Math.max(0, Math.min(100, used * 100));
    this._budgetFill.style.width = `${pct}%`;
    setText(this._budgetLabel, text);
    this._budget.setAttribute('aria-valuenow', String(Math.round(pct)));
    this._budget.classList.toggle('gpugeek-mod-warn', used >= cluster.budget_warn_at);
    this._budget.classList.toggle('gpugeek-mod-over', used >= 1);
  }

  private _setExpanded(expanded: boolean): void {
    this._expanded = expanded;
    this._toggle.setAttribute('aria-expanded', String(expanded));
    this.node.classList.toggle('gpugeek-mod-expanded', expanded);
    this._detail.hidden = !expanded;
    if (expanded) {
      if (!this._detail.hasChildNodes()) {
        this._detail.appendChild(h('div', 'gpugeek-muted', 'Loading…'));
      }
      void this._loadDetail();
    }
  }

  /** Fetches the node rows and utilisation; one request at a time. */
  private async _loadDetail(): Promise<void> {
    if (this._loading) {
      return;
    }
    this._loading = true;
    let content: HTMLElement;
    try {
      content = renderDetail(await this._model.detail(this.name, this.id));
    } catch (error) {
      content = h('div', 'gpugeek-error', errorMessage(error));
    } finally {
      this._loading = false;
    }
    this._detail.replaceChildren(content);
  }

  private _actions = h('div', 'gpugeek-cluster-actions');
  private _attach: HTMLButtonElement;
  private _backend = h('span', 'gpugeek-backend');
  private _budget = h('div', 'gpugeek-budget');
  private _budgetFill = h('div', 'gpugeek-budget-fill');
  private _budgetLabel = h('span', 'gpugeek-budget-label');
  private _dashboard: HTMLButtonElement;
  private _detail = h('div', 'gpugeek-cluster-detail');
  private _expanded = false;
  private _guard = h('div', 'gpugeek-cluster-guard');
  private _loading = false;
  private _rate = h('span', 'gpugeek-rate');
  private _shape = h('span', 'gpugeek-shape');
  private _shutdown: HTMLButtonElement;
  private _simBadge = h('span', 'gpugeek-sim-badge', 'SIMULATED $');
  private _spent = h('span', 'gpugeek-spent');
  private _status = h('div', 'gpugeek-cluster-status');
  private _toggle = h('button', 'gpugeek-cluster-name');
}

namespace Private {
  /** The status line, from the cluster's state: the server's words for a live one, and when
   * and why a stopped one stopped. */
  export function status(cluster: ICluster, stopping: boolean): string {
    if (stopping) {
      return cluster.detaches ? 'detaching…' : 'stopping…';
    }
    switch (cluster.state) {
      case 'starting':
        return `starting… (began ${ago(cluster.created)})`;
      case 'stopping':
        return 'stopping…';
      case 'stopped': {
        const reason = cluster.stop_reason ? ` (${cluster.stop_reason})` : '';
        return cluster.stopped === null ? `stopped${reason}` : `stopped ${ago(cluster.stopped)}${reason}`;
      }
      default:
        return cluster.status;
    }
  }

  /** The shutdown button's tooltip. */
  export function shutdownTitle(cluster: ICluster, detach: boolean): string {
    const what = detach
      ? 'Drop the link to this Ray cluster; nothing is stopped, it keeps running'
      : 'Stop this cluster and every node it is billed for';
    if (cluster.state === 'starting') {
      return `${what}. Still starting: the server refuses until its %gpugeek up has finished.`;
    }
    if (cluster.state === 'stopping') {
      return `${what}. It is already stopping elsewhere; ask again if that stop seems stuck.`;
    }
    return what;
  }
}
