/**
 * The expanded part of a cluster card: what each node costs, the latest
 * utilisation sample per node and GPU, and the last few events.
 */
import type { IClusterDetail, IUtilisation } from './api';
import { h } from './dom';
import { ago, duration, gpuCount, usd, usdPerHour } from './format';

const MAX_EVENTS = 5;

/** Builds the detail view of one cluster (a fresh element; the card swaps it in). */
export function renderDetail(detail: IClusterDetail): HTMLElement {
  const root = h('div', 'gpugeek-detail-body');
  root.appendChild(nodeTable(detail));
  if (detail.utilisation.length > 0) {
    root.appendChild(utilisationTable(detail.utilisation));
  }
  if (detail.events.length > 0) {
    root.appendChild(eventList(detail));
  }
  return root;
}

/** Ray node ids are 56 hex digits: show the end, keep the whole id in the tooltip. */
function nodeCell(id: string): Cell {
  return id.length > 12 ? { text: `…${id.slice(-6)}`, title: id } : id;
}

type Cell = string | { text: string; title: string };

function table(className: string, headers: string[], rows: Cell[][]): HTMLTableElement {
  const element = h('table', `gpugeek-table ${className}`);
  const head = element.createTHead().insertRow();
  for (const label of headers) {
    head.appendChild(h('th', '', label));
  }
  const body = element.createTBody();
  for (const cells of rows) {
    const row = body.insertRow();
    for (const cell of cells) {
      const td = row.insertCell();
      if (typeof cell === 'string') {
        td.textContent = cell;
      } else {
        td.textContent = cell.text;
        td.title = cell.title;
      }
    }
  }
  return element;
}

function nodeTable(detail: IClusterDetail): HTMLElement {
  if (detail.node_rows.length === 0) {
    return h('div', 'gpugeek-muted', 'No nodes metered yet.');
  }
  const rows = detail.node_rows.map(r => [
    nodeCell(r.node),
    r.type,
    gpuCount(r.gpus),
    r.pricing,
    usdPerHour(r.usd_per_hour),
    duration(r.up_s),
    usd(r.usd),
    r.alive ? 'up' : 'gone'
  ]);
  return table(
    'gpugeek-nodes-table',
    ['Node', 'Type', 'GPUs', 'Pricing', '$/h', 'Up', '$', ''],
    rows
  );
}

function utilisationTable(samples: IUtilisation[]): HTMLElement {
  const rows = samples.map(s => [
    nodeCell(s.node),
    s.gpu === null ? 'host' : `GPU ${s.gpu}`,
    pct(s.util_pct),
    pct(s.mem_pct),
    ago(s.at)
  ]);
  return table('gpugeek-util-table', ['Node', 'Device', 'Util', 'Mem', 'Sampled'], rows);
}

/** `45 %`, or `—` when the sample has no such figure. */
function pct(value: number | null): string {
  return value === null || !Number.isFinite(value) ? '—' : `${Math.round(value)} %`;
}

function eventList(detail: IClusterDetail): HTMLElement {
  const list = h('ul', 'gpugeek-events');
  const newest = [...detail.events].sort((a, b) => b.at - a.at).slice(0, MAX_EVENTS);
  for (const event of newest) {
    const item = h('li', '', `${ago(event.at)} · ${event.kind}: ${event.message}`);
    list.appendChild(item);
  }
  return list;
}
