/**
 * The extension's icon: a small GPU card (bracket, board, fan, edge connector),
 * themed like JupyterLab's own icons.
 */
import { LabIcon } from '@jupyterlab/ui-components';

const gpuSvg = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M1 4h2v17H1z"/>
    <path fill-rule="evenodd" d="M4 6h18a1 1 0 0 1 1 1v10a1 1 0 0 1-1 1H4zm2 2v8h15V8z"/>
    <path fill-rule="evenodd" d="M11 8.5a3.5 3.5 0 1 1 0 7 3.5 3.5 0 0 1 0-7zm0 2a1.5 1.5 0 1 0 0 3 1.5 1.5 0 0 0 0-3z"/>
    <path d="M16 9h1.5v6H16zM18.5 9H20v6h-1.5zM7 18h10v2.5H7z"/>
  </g>
</svg>`;

export const gpuIcon = new LabIcon({ name: 'gpugeek-jupyter:gpu', svgstr: gpuSvg });
