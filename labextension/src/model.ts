/**
 * The one model behind the status bar and the sidebar: the latest cluster list,
 * kept fresh by a single Lumino Poll that backs off while the server is unreachable
 * and stands by while the browser tab is hidden.
 */
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import {
  errorMessage,
  GpugeekApi,
  ICluster,
  IClusterDetail,
  IClusterList,
  IStopResult
} from './api';

/** Poll timing, in seconds, as the settings give it. */
export interface IPollSettings {
  pollInterval: number;
  maxBackoff: number;
}

export const DEFAULT_POLL: IPollSettings = { pollInterval: 5, maxBackoff: 60 };

export class ClustersModel {
  constructor(
    readonly api: GpugeekApi,
    settings: IPollSettings = DEFAULT_POLL
  ) {
    this._poll = new Poll<void, unknown, 'standby'>({
      auto: false,
      factory: () => this._fetch(),
      frequency: Private.frequency(settings),
      name: 'gpugeek-jupyter:clusters',
      standby: 'when-hidden'
    });
  }

  /** Emitted whenever the list, the error or a stopping flag changes. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** The latest list, or null before the first successful poll. */
  get list(): IClusterList | null {
    return this._list;
  }

  /** Why the last poll failed, or null when it succeeded. */
  get error(): string | null {
    return this._error;
  }

  get live(): ICluster[] {
    return this._list?.clusters.filter(c => c.live) ?? [];
  }

  get stopped(): ICluster[] {
    return this._list?.clusters.filter(c => !c.live) ?? [];
  }

  get isDisposed(): boolean {
    return this._poll.isDisposed;
  }

  find(name: string): ICluster | undefined {
    return this._list?.clusters.find(c => c.name === name);
  }

  /** Whether a shutdown this page asked for is still in progress. */
  isStopping(name: string): boolean {
    return this._stopping.has(name);
  }

  /** Starts polling (the first fetch happens at once). */
  start(): Promise<void> {
    this._started = true;
    return this._poll.start();
  }

  /** Applies new poll timing at once: refetches now, then ticks at the new interval. */
  configure(settings: IPollSettings): void {
    this._poll.frequency = Private.frequency(settings);
    if (this._started) {
      void this.refresh();
    }
  }

  /** Fetches now and resolves once the new list (or error) is in. */
  async refresh(): Promise<void> {
    if (this.isDisposed) {
      return;
    }
    await this._poll.refresh();
    await this._poll.tick.catch(() => undefined);
  }

  /** Full view of one cluster: node rows, latest utilisation, events. */
  detail(name: string): Promise<IClusterDetail> {
    return this.api.cluster(name);
  }

  /** Shuts a cluster down, marking it "stopping" meanwhile, then refreshes. */
  async stop(name: string): Promise<IStopResult> {
    this._stopping.add(name);
    this._changed.emit();
    try {
      return await this.api.stop(name);
    } finally {
      this._stopping.delete(name);
      this._changed.emit();
      void this.refresh();
    }
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._poll.dispose();
    Signal.clearData(this);
  }

  private async _fetch(): Promise<void> {
    try {
      this._list = await this.api.clusters();
      this._error = null;
    } catch (error) {
      this._error = errorMessage(error);
      throw error; // the poll backs off
    } finally {
      this._changed.emit();
    }
  }

  private _changed = new Signal<this, void>(this);
  private _error: string | null = null;
  private _list: IClusterList | null = null;
  private _poll: Poll<void, unknown, 'standby'>;
  private _started = false;
  private _stopping = new Set<string>();
}

namespace Private {
  /** Poll frequency in ms; the back-off ceiling is never below the interval. */
  export function frequency(settings: IPollSettings) {
    const interval = Math.max(1, settings.pollInterval) * 1000;
    const max = Math.max(interval, settings.maxBackoff * 1000);
    return { interval, max, backoff: true };
  }
}
