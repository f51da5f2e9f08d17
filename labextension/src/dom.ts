/**
 * A tiny DOM helper: every piece of server text goes in through textContent, never as HTML.
 */

/** Creates `<tag class="...">text</tag>`. */
export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className = '',
  text?: string
): HTMLElementTagNameMap[K] {
  const element = document.createElement(tag);
  if (className) {
    element.className = className;
  }
  if (text !== undefined) {
    element.textContent = text;
  }
  return element;
}

/** A `<button class="gpugeek-button ...">` that runs `onClick` without bubbling. */
export function button(className: string, label: string, onClick: () => void): HTMLButtonElement {
  const element = h('button', `gpugeek-button ${className}`, label);
  element.type = 'button';
  element.addEventListener('click', event => {
    event.stopPropagation();
    onClick();
  });
  return element;
}

/** Sets text only when it changed, so the DOM is not touched on every poll. */
export function setText(element: HTMLElement, text: string): void {
  if (element.textContent !== text) {
    element.textContent = text;
  }
}
