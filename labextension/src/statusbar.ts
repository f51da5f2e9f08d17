/**
 * Status-bar item: live clusters and what they cost, e.g. `2 clusters · $3.42 · $1.20/h`;
 * `gpugeek: server unreachable` when a poll gets no response, `gpugeek: error` when the
 * server answers with an error (its message in the tooltip). Clicking it opens the sidebar.
 */
import { Widget } from '@lumino/widgets';

import { summary } from './format';
import { ClustersModel } from './model';

export class ClustersStatus extends Widget {
  constructor(
    private readonly _model: ClustersModel,
    private readonly _open: () => void
  ) {
    super();
    this.addClass('gpugeek-statusbar');
    this.addClass('jp-mod-highlighted');
    this._text.className = 'jp-StatusBar-TextItem gpugeek-statusbar-text';
    this.node.appendChild(this._text);
    this.node.setAttribute('role', 'button');
    this.node.tabIndex = 0;
    this.node.addEventListener('click', this._open);
    this.node.addEventListener('keydown', event => {
      if (event.key === 'Enter' || event.key === ' ') {
        event.preventDefault();
        this._open();
      }
    });
    _model.changed.connect(this._render, this);
    this._render();
  }

  override dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._model.changed.disconnect(this._render, this);
    super.dispose();
  }

  private _render(): void {
    const { list, error } = this._model;
    let text: string;
    let title: string;
    let state: 'loading' | 'ok' | 'error';
    if (error !== null) {
      // no response at all is "unreachable"; an HTTP error (403, 500 …) reached the server
      state = 'error';
      const status = this._model.errorStatus;
      const code = status !== null && !error.includes(String(status)) ? ` (HTTP ${status})` : '';
      text = this._model.unreachable ? 'gpugeek: server unreachable' : 'gpugeek: error';
      title =
        `gpugeek: ${error}${code}\n` +
        'Retrying with back-off. Click to open the GPU clusters sidebar.';
    } else if (list === null) {
      state = 'loading';
      text = 'gpugeek …';
      title = 'Loading GPU clusters';
    } else {
      state = 'ok';
      text = summary(list);
      title =
        (list.live === 0
          ? 'No live GPU clusters.'
          : `Live GPU clusters: ${text}${
              list.simulated ? '\n(sim): some of these dollars are simulated.' : ''
            }`) + '\nClick to open the GPU clusters sidebar.';
    }
    this._text.textContent = text;
    this.node.title = title;
    this.node.dataset.state = state;
    this.node.dataset.live = String(list?.live ?? 0);
    this.toggleClass('gpugeek-mod-error', state === 'error');
    this.toggleClass('gpugeek-mod-sim', state === 'ok' && list?.simulated === true);
    this.toggleClass('gpugeek-mod-idle', state === 'ok' && list?.live === 0);
  }

  private _text = document.createElement('span');
}
