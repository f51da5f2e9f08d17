/**
 * Pure text formatting shared by the status bar, the sidebar and the dialogs.
 */
import type { ICluster, IClusterList } from './api';

const dollars = new Intl.NumberFormat('en-US', {
  style: 'currency',
  currency: 'USD',
  minimumFractionDigits: 2,
  maximumFractionDigits: 2
});

/** `$3.42`; amounts under half a cent that are not zero read `<$0.01`. */
export function usd(value: number | null | undefined): string {
  if (value === null || value === undefined || !Number.isFinite(value)) {
    return '—';
  }
  if (value > 0 && value < 0.005) {
    return '<$0.01';
  }
  return dollars.format(value);
}

/** `$1.20/h`. */
export function usdPerHour(value: number | null | undefined): string {
  return `${usd(value)}/h`;
}

/** `1 cluster`, `2 clusters`. */
export function plural(count: number, noun: string): string {
  return `${count} ${noun}${count === 1 ? '' : 's'}`;
}

/** GPU counts may be fractional (Ray resources): `8`, `0.5`. */
export function gpuCount(value: number): string {
  return Number.isInteger(value) ? String(value) : value.toFixed(2).replace(/0+$/, '');
}

/** `45 %`. */
export function percent(fraction: number): string {
  return `${Math.round(fraction * 100)} %`;
}

/** `42s`, `3m`, `2h 05m`, `3d 4h`. */
export function duration(seconds: number): string {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) {
    return `${s}s`;
  }
  const m = Math.floor(s / 60);
  if (m < 60) {
    return `${m}m`;
  }
  const h = Math.floor(m / 60);
  if (h < 24) {
    return `${h}h ${String(m % 60).padStart(2, '0')}m`;
  }
  return `${Math.floor(h / 24)}d ${h % 24}h`;
}

/** `3m ago`, from unix seconds. */
export function ago(unixSeconds: number, now: number = Date.now() / 1000): string {
  return `${duration(now - unixSeconds)} ago`;
}

/**
 * The status-bar text: `2 clusters · $3.42 · $1.20/h`, with `(sim)` after the
 * count when any of the dollars are simulated, or `no clusters`.
 */
export function summary(list: IClusterList): string {
  if (list.live === 0) {
    return 'no clusters';
  }
  const sim = list.simulated ? ' (sim)' : '';
  return `${plural(list.live, 'cluster')}${sim} · ${usd(list.spent_usd)} · ${usdPerHour(
    list.usd_per_hour
  )}`;
}

/** `2 nodes · 8 GPUs` for one cluster. */
export function shape(cluster: ICluster): string {
  return `${plural(cluster.nodes, 'node')} · ${gpuCount(cluster.gpus)} GPU${
    cluster.gpus === 1 ? '' : 's'
  }`;
}

/** `$3.42 of $5.00 (68 %)`, or null when the cluster has no budget. */
export function budgetText(cluster: ICluster): string | null {
  if (cluster.budget_usd === null) {
    return null;
  }
  const used = budgetUsed(cluster) ?? 0;
  return `${usd(cluster.spent_usd)} of ${usd(cluster.budget_usd)} budget (${percent(used)})`;
}

/** Fraction of the budget spent, or null without a budget. */
export function budgetUsed(cluster: ICluster): number | null {
  if (cluster.budget_usd === null) {
    return null;
  }
  if (cluster.budget_used !== null) {
    return cluster.budget_used;
  }
  return cluster.budget_usd > 0 ? cluster.spent_usd / cluster.budget_usd : 1;
}
