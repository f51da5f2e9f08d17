/**
 * Typed client for the REST API that gpugeek_jupyter's server extension serves
 * under `<base_url>/gpugeek/`. Token and XSRF handling come from ServerConnection.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

/**
 * Where a cluster is in its life (the server's `ClusterPhase`). `starting` while its
 * `%gpugeek up` is still at work (for up to 10 minutes); `failed` when that `up` failed and
 * stopping what it had started failed too: it may still be billing, and a shut down retries.
 */
export type ClusterState = 'starting' | 'running' | 'failed' | 'stopping' | 'stopped';

/** Its watchdog's looks failing in a row (3 or more: the status line says why). */
export interface IGuardFailing {
  since: number;
  looks: number;
  error: string;
  by?: string;
  at?: number;
  budget?: number | null;
  burn?: number | null;
}

/** Who enforced its limits when it was last heard. */
export interface IGuard {
  by: string;
  pid: number | null;
  host: string;
  beat?: number | null;
}

/**
 * One cluster (one run) as `GET gpugeek/clusters` lists it: the server's `ClusterModel`
 * (`gpugeek_jupyter/guard/board.py`), field by field (tests/test_cluster_model.py holds the two
 * equal). The card asks what a cluster can do (`detaches`), never its backend's name.
 */
export interface ICluster {
  /** Tells runs apart: a name is reused after `down`, so a live and a stopped run may share it. */
  id: number;
  name: string;
  /** The backend's name, shown as it is. */
  backend: string;
  live: boolean;
  state: ClusterState;
  /** The state said for people, e.g. "running — orphan: no notebook attached". */
  status: string;
  /** This machine has not heard from the remote cluster since then: its $ are an estimate. */
  unheard_since: number | null;
  guard: IGuard | null;
  /** When this machine last heard from it. */
  heard: number | null;
  /** Who enforces the budget and idle stop now, said ("the head's watchdog (pid 12 on …)"); null: nothing. */
  guarded_by: string | null;
  /** The same in a word: the head's watchdog, this machine's, or null (nothing enforces them). */
  guard_by: 'head' | 'here' | null;
  simulated: boolean;
  /** Someone else's cluster: a shut down lets go of it and stops nothing. */
  detaches: boolean;
  nodes: number;
  gpus: number;
  spent_usd: number;
  usd_per_hour: number;
  budget_usd: number | null;
  /** Fraction of the budget spent (may pass 1). */
  budget_used: number | null;
  budget_warn_at: number;
  idle_minutes: number | null;
  /** The watchdog's idle clock (null: busy). */
  idle_since: number | null;
  /** What that clock rests on. */
  idle_why: string | null;
  orphan: boolean;
  /** Its watchdog is gone: the budget cap and idle stop are not enforced. */
  watchdog_gone: boolean;
  watchdog_pid: number | null;
  guard_failing: IGuardFailing | null;
  address: string | null;
  dashboard_url: string | null;
  /** Notebook-cell source that re-attaches a kernel to this cluster. */
  attach_code: string;
  created: number;
  stopped: number | null;
  stop_reason: string | null;
}

/** `GET gpugeek/clusters`: live clusters first, then recently stopped ones. */
export interface IClusterList {
  clusters: ICluster[];
  live: number;
  spent_usd: number;
  usd_per_hour: number;
  simulated: boolean;
  at: number;
}

export interface INodeRow {
  node: string;
  type: string;
  gpus: number;
  pricing: string;
  usd_per_hour: number;
  up_s: number;
  usd: number;
  alive: boolean;
}

/** Latest sample per node and GPU; `gpu` is null for the host itself. */
export interface IUtilisation {
  node: string;
  gpu: number | null;
  /** Null when the sample carried no utilisation figure. */
  util_pct: number | null;
  mem_pct: number | null;
  at: number;
}

export interface IClusterEvent {
  at: number;
  kind: string;
  message: string;
}

/** `GET gpugeek/clusters/<name>?id=<id>`. */
export interface IClusterDetail extends ICluster {
  node_rows: INodeRow[];
  utilisation: IUtilisation[];
  events: IClusterEvent[];
}

/**
 * `DELETE gpugeek/clusters/<name>`: stops (an `attach` cluster: detaches) the live cluster of
 * that name. 409 with a message when it is still starting or has already stopped.
 */
export interface IStopResult {
  name: string;
  stopped: boolean;
  reason: string;
  spent_usd: number;
  simulated: boolean;
  message: string;
}

export interface IOffer {
  offer_id: string;
  provider: string;
  gpu: string;
  gpus: number;
  pricing: string;
  usd_per_hour: number;
  usd_per_gpu_hour: number;
  [key: string]: unknown;
}

export interface IOfferList {
  offers: IOffer[];
  count: number;
}

export interface IOfferQuery {
  gpu?: string;
  count?: number;
  pricing?: string;
  limit?: number;
}

/** A failed request, with the one-line message the server (or the network) gave. */
export class ApiError extends Error {
  constructor(
    message: string,
    readonly status: number | null
  ) {
    super(message);
    this.name = 'ApiError';
  }
}

/** Whether `error` is a request that got no response at all (network failure). */
export function isUnreachable(error: unknown): boolean {
  return error instanceof ApiError && error.status === null;
}

/** Whether `error` is an HTTP error response with this status. */
export function hasStatus(error: unknown, status: number): boolean {
  return error instanceof ApiError && error.status === status;
}

/** The message to show a user for any error thrown while talking to the server. */
export function errorMessage(error: unknown): string {
  if (error instanceof Error) {
    return error.message;
  }
  return String(error);
}

/** REST client; one instance is shared by the model and the commands. */
export class GpugeekApi {
  constructor(
    readonly serverSettings: ServerConnection.ISettings = ServerConnection.makeSettings()
  ) {}

  clusters(): Promise<IClusterList> {
    return this._request<IClusterList>('clusters');
  }

  /** The run `id` of cluster `name`; without an id, the live one of that name, else its latest. */
  cluster(name: string, id?: number): Promise<IClusterDetail> {
    const query = id === undefined ? '' : URLExt.objectToQueryString({ id: String(id) });
    return this._request<IClusterDetail>(
      URLExt.join('clusters', encodeURIComponent(name)) + query
    );
  }

  stop(name: string): Promise<IStopResult> {
    return this._request<IStopResult>(URLExt.join('clusters', encodeURIComponent(name)), {
      method: 'DELETE'
    });
  }

  offers(query: IOfferQuery = {}): Promise<IOfferList> {
    const params: Record<string, string> = {};
    for (const [key, value] of Object.entries(query)) {
      if (value !== undefined && value !== '') {
        params[key] = String(value);
      }
    }
    return this._request<IOfferList>('offers' + URLExt.objectToQueryString(params));
  }

  private async _request<T>(path: string, init: RequestInit = {}): Promise<T> {
    const url = URLExt.join(this.serverSettings.baseUrl, 'gpugeek', path);
    let response: Response;
    try {
      response = await ServerConnection.makeRequest(url, init, this.serverSettings);
    } catch (error) {
      throw new ApiError(`server unreachable (${errorMessage(error)})`, null);
    }
    const text = await response.text();
    let body: unknown = undefined;
    try {
      body = text ? JSON.parse(text) : undefined;
    } catch {
      body = undefined;
    }
    if (!response.ok) {
      throw new ApiError(Private.failure(response, body), response.status);
    }
    if (body === undefined) {
      throw new ApiError(`unexpected reply from ${url} (not JSON)`, response.status);
    }
    return body as T;
  }
}

namespace Private {
  /** One line saying why a request failed, preferring the server's own message. */
  export function failure(response: Response, body: unknown): string {
    if (
      typeof body === 'object' &&
      body !== null &&
      'message' in body &&
      typeof body.message === 'string' &&
      body.message
    ) {
      return body.message;
    }
    if (response.status === 404) {
      return 'not found (404): is the gpugeek_jupyter server extension enabled?';
    }
    if (response.status === 403) {
      return 'not authorised (403): reload the page to log in again';
    }
    return `${response.status} ${response.statusText}`.trim();
  }
}
