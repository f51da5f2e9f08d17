/**
 * The expanded part of a cluster card: what each node costs, the latest
 * utilisation sample per node and GPU, and the last few events.
 *
 * The sidebar is narrow (250 px by default), so each table keeps what a row is and its
 * figures as columns — node, GPUs, $/h, $; device, util, mem, sampled — and says the
 * rest (a node's id, pricing, how long it has been up) in a muted line under the first
 * cell, where it may wrap; figures never wrap.
 */
import type { IClusterDetail, IUtilisation } from './api';
import { h } from './dom';
import { ago, duration, gpuCount, usd } from './format';

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

/** Ray node ids are 56 hex digits: show the end (the cell's tooltip holds the whole id). */
function shortId(id: string): string {
  return id.length > 12 ? `…${id.slice(-6)}` : id;
}

/** A cell's text; with a tooltip, and a muted second line of parts that wraps between them. */
type Cell = string | { text: string; title?: string; sub?: string[] };

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
        continue;
      }
      td.textContent = cell.text;
      if (cell.title) {
        td.title = cell.title;
      }
      if (cell.sub) {
        const sub = h('div', 'gpugeek-table-sub');
        cell.sub.forEach((part, i) => {
          sub.append(...(i > 0 ? [' · '] : []), h('span', '', part));
        });
        td.appendChild(sub);
      }
    }
  }
  return element;
}

function nodeTable(detail: IClusterDetail): HTMLElement {
  if (detail.node_rows.length === 0) {
    return h('div', 'gpugeek-muted', 'No nodes metered yet.');
  }
  const rows = detail.node_rows.map(r => {
    const life = r.alive ? `up ${duration(r.up_s)}` : `gone after ${duration(r.up_s)}`;
    const node: Cell = {
      text: r.type || 'node',
      title: r.node,
      sub: [shortId(r.node), r.pricing, life]
    };
    return [node, gpuCount(r.gpus), usd(r.usd_per_hour), usd(r.usd)];
  });
  const element = table('gpugeek-nodes-table', ['Node', 'GPUs', '$/h', '$'], rows);
  detail.node_rows.forEach((r, i) => {
    element.tBodies[0].rows[i].classList.toggle('gpugeek-mod-gone', !r.alive);
  });
  return element;
}

function utilisationTable(samples: IUtilisation[]): HTMLElement {
  const rows = samples.map(s => {
    const device: Cell = {
      text: s.gpu === null ? 'host' : `GPU ${s.gpu}`,
      title: s.node,
      sub: [shortId(s.node)]
    };
    return [device, pct(s.util_pct), pct(s.mem_pct), ago(s.at)];
  });
  return table('gpugeek-util-table', ['Device', 'Util', 'Mem', 'Sampled'], rows);
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
