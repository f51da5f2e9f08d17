/**
 * Left sidebar: totals, one card per live cluster, an empty state that says how to
 * start one, and a collapsed "Recently stopped" section with final costs. Cards are
 * keyed by cluster id: a live `local` and a stopped `local` are two cards.
 */
import { refreshIcon } from '@jupyterlab/ui-components';
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { ICluster } from './api';
import { ClusterCard, ICardActions } from './card';
import { h, setText } from './dom';
import { plural, usd, usdPerHour } from './format';
import { gpuIcon } from './icons';
import { ClustersModel } from './model';

export const SIDEBAR_ID = 'gpugeek-sidebar';

export interface ISidebarOptions {
  model: ClustersModel;
  actions: ICardActions;
  /** Runs the refresh command (the header's button). */
  refresh: () => void;
}

export class ClustersSidebar extends Widget {
  constructor(options: ISidebarOptions) {
    super();
    this._model = options.model;
    this._actions = options.actions;
    this.id = SIDEBAR_ID;
    this.addClass('gpugeek-sidebar');
    this.title.icon = gpuIcon;
    this.title.caption = 'GPU clusters';

    const header = h('div', 'gpugeek-sidebar-header');
    const title = h('h2', 'gpugeek-sidebar-title', 'GPU clusters');
    const refresh = h('button', 'gpugeek-refresh');
    refresh.type = 'button';
    refresh.title = 'Refresh GPU clusters';
    refresh.setAttribute('aria-label', 'Refresh GPU clusters');
    refreshIcon.element({ container: refresh, tag: 'span' });
    refresh.addEventListener('click', () => options.refresh());
    header.append(title, refresh);

    this._empty.append(
      h('p', '', 'No GPU clusters running. To start one, run in a notebook:'),
      h('pre', 'gpugeek-code', '%load_ext gpugeek_jupyter\n%gpugeek up')
    );

    const summary = h('summary', '');
    summary.appendChild(this._stoppedTitle);
    this._stoppedSection.append(summary, this._stoppedList);

    this.node.append(
      header,
      this._totals,
      this._error,
      this._empty,
      this._liveList,
      this._stoppedSection
    );
    this._model.changed.connect(this._onChanged, this);
    this._render();
  }

  override dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._model.changed.disconnect(this._onChanged, this);
    super.dispose();
  }

  protected override onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this._render();
  }

  private _onChanged(): void {
    if (this.isVisible) {
      this._render();
    }
  }

  private _render(): void {
    const { list, error } = this._model;
    this._error.hidden = error === null;
    setText(this._error, error === null ? '' : `gpugeek: ${error} (retrying with back-off)`);

    const live = this._model.live;
    const stopped = this._model.stopped;
    this._totals.hidden = list === null;
    if (list !== null) {
      const sim = list.simulated ? ' (simulated $)' : '';
      setText(
        this._totals,
        `${plural(list.live, 'live cluster')} · ${usd(list.spent_usd)} · ${usdPerHour(
          list.usd_per_hour
        )}${sim}`
      );
    }
    this._empty.hidden = list === null || live.length > 0;
    this._liveList.hidden = live.length === 0;
    this._stoppedSection.hidden = stopped.length === 0;
    setText(this._stoppedTitle, `Recently stopped (${stopped.length})`);

    const seen = new Set<number>();
    this._place(this._liveList, live, seen);
    this._place(this._stoppedList, stopped, seen);
    for (const [id, card] of this._cards) {
      if (!seen.has(id)) {
        card.dispose();
        this._cards.delete(id);
      }
    }
  }

  /** Updates the cards for `clusters` and puts them in `container`, in order. */
  private _place(container: HTMLElement, clusters: ICluster[], seen: Set<number>): void {
    clusters.forEach((cluster, index) => {
      seen.add(cluster.id);
      let card = this._cards.get(cluster.id);
      if (!card) {
        card = new ClusterCard(cluster, this._model, this._actions);
        this._cards.set(cluster.id, card);
      }
      card.update(cluster);
      // Move a card only when it is out of place, so a focused button keeps its focus.
      if (container.children[index] !== card.node) {
        container.insertBefore(card.node, container.children[index] ?? null);
      }
    });
  }

  private _actions: ICardActions;
  private _cards = new Map<number, ClusterCard>();
  private _empty = h('div', 'gpugeek-empty');
  private _error = h('div', 'gpugeek-error');
  private _liveList = h('div', 'gpugeek-live-list');
  private _model: ClustersModel;
  private _stoppedList = h('div', 'gpugeek-stopped-list');
  private _stoppedSection = h('details', 'gpugeek-stopped');
  private _stoppedTitle = h('span', 'gpugeek-stopped-title');
  private _totals = h('div', 'gpugeek-totals');
}
