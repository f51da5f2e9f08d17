/**
 * The one model behind the status bar and the sidebar: the latest cluster list,
 * kept fresh by a single Lumino Poll that backs off while the server is unreachable
 * and stands by while the browser tab is hidden.
 */
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import {
  ApiError,
  errorMessage,
  GpugeekApi,
  ICluster,
  IClusterDetail,
  IClusterList,
  isUnreachable,
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

  /** The HTTP status of the last failed poll; null when it succeeded or got no response. */
  get errorStatus(): number | null {
    return this._errorStatus;
  }

  /** Whether the last poll failed for want of any response (a network failure). */
  get unreachable(): boolean {
    return this._unreachable;
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

  /** The live cluster of that name, else its latest stopped run. */
  find(name: string): ICluster | undefined {
    const runs = this._list?.clusters.filter(c => c.name === name) ?? [];
    return runs.find(c => c.live) ?? runs[0];
  }

  /** One run, by its id. */
  findById(id: number): ICluster | undefined {
    return this._list?.clusters.find(c => c.id === id);
  }

  /** Whether a shutdown this page asked for (of run `id`) is still in progress. */
  isStopping(id: number): boolean {
    return this._stopping.has(id);
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

  /** Full view of one cluster (the run `id`, if given): node rows, latest utilisation, events. */
  detail(name: string, id?: number): Promise<IClusterDetail> {
    return this.api.cluster(name, id);
  }

  /**
   * Shuts a live cluster down (the server stops the live run of its name), marking it
   * "stopping" meanwhile, then refreshes whatever the answer.
   */
  async stop(cluster: ICluster): Promise<IStopResult> {
    this._stopping.add(cluster.id);
    this._changed.emit();
    try {
      return await this.api.stop(cluster.name);
    } finally {
      this._stopping.delete(cluster.id);
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
      this._errorStatus = null;
      this._unreachable = false;
    } catch (error) {
      this._error = errorMessage(error);
      this._errorStatus = error instanceof ApiError ? error.status : null;
      this._unreachable = isUnreachable(error);
      throw error; // the poll backs off
    } finally {
      this._changed.emit();
    }
  }

  private _changed = new Signal<this, void>(this);
  private _error: string | null = null;
  private _errorStatus: number | null = null;
  private _list: IClusterList | null = null;
  private _poll: Poll<void, unknown, 'standby'>;
  private _started = false;
  private _stopping = new Set<number>();
  private _unreachable = false;
}

namespace Private {
  /** Poll frequency in ms; the back-off ceiling is never below the interval. */
  export function frequency(settings: IPollSettings) {
    const interval = Math.max(1, settings.pollInterval) * 1000;
    const max = Math.max(interval, settings.maxBackoff * 1000);
    return { interval, max, backoff: true };
  }
}
