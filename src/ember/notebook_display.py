"""Rich display of tensors and modules in Jupyter: the HTML behind their ``_repr_html_``.

A notebook shows the last value of a cell with its ``_repr_html_`` when it has one. A
tensor shows a header line (shape, dtype, device, backend) over its values, summarized as
``print`` does (``EMBER_PRINT_THRESHOLD``); a module shows its tree of fields as nested,
foldable ``<details>`` with each parameter's shape, dtype and element count. Every piece
of text goes through :func:`html.escape`: a module's configuration values are arbitrary.

Example:
    >>> from ember import Tensor
    >>> print(tensor_html(Tensor.from_data([[1.0, 2.0]])))  # doctest: +ELLIPSIS
    <div class="ember-tensor"><b>Tensor</b> shape [1, 2] · dtype f32 · ...<pre>[[1.0, 2.0]]</pre></div>
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

from ember.backend.errors import fmt_shape

if TYPE_CHECKING:
    from ember.module.module import Module
    from ember.tensor.tensor import Tensor

# A module tree longer than this many rows is cut: a notebook cell is no place for a
# 10 000-layer listing, and the browser would slow down on it.
MAX_MODULE_ROWS = 300
# Configuration values are shown up to this many characters.
MAX_VALUE_CHARS = 60


def tensor_html(tensor: Tensor) -> str:
    """The tensor as HTML: shape, dtype, device and backend, then its (summarized) values."""
    from ember.tensor.printing import _threshold

    data = tensor.into_data()
    facts = (
        f"shape {fmt_shape(data.shape)} · dtype {data.dtype} · device {tensor.device} · "
        f"backend {tensor.backend.name}"
    )
    values = data.format(threshold=_threshold())
    return (
        f'<div class="ember-tensor"><b>Tensor</b> {html.escape(facts)}'
        f"<pre>{html.escape(values)}</pre></div>"
    )


def module_html(module: Module) -> str:
    """The module as nested ``<details>``: sub-modules fold, parameters are table rows."""
    budget = [MAX_MODULE_ROWS]
    body = _node_html(type(module).__name__, module, budget, open_=True)
    if budget[0] < 0:
        body += f"<p>… (cut after {MAX_MODULE_ROWS} rows)</p>"
    return f'<div class="ember-module">{body}</div>'


def _node_html(name: str, value: Any, budget: list[int], open_: bool = False) -> str:
    from ember.module.module import Module, _holds_state
    from ember.module.param import Param
    from ember.tensor.tensor import Tensor

    budget[0] -= 1
    if budget[0] < 0:
        return ""
    label = html.escape(name)
    if isinstance(value, Param):
        return (
            f"<tr><td>{label}</td><td>{html.escape(fmt_shape(value.shape))}</td>"
            f"<td>{html.escape(str(value.dtype))}</td><td>{value.num_elements():,}</td></tr>"
        )
    if isinstance(value, Tensor):
        return (
            f"<tr><td>{label} (constant)</td><td>{html.escape(fmt_shape(value.shape))}</td>"
            f"<td>{html.escape(str(value.dtype))}</td><td>{value.num_elements():,}</td></tr>"
        )
    if isinstance(value, Module):
        items: list[tuple[str, Any]] = [(n, v) for n, v in value.fields()]
        head = f"{name}: {type(value).__name__}" if name != type(value).__name__ else name
        count = f"{value.num_params():,} params"
    elif isinstance(value, list | tuple | dict) and _holds_state(value):
        pairs = value.items() if isinstance(value, dict) else enumerate(value)
        items = [(str(k), v) for k, v in pairs]
        head = f"{name}: {type(value).__name__}[{len(value)}]"
        count = ""
    else:
        text = repr(value)
        if len(text) > MAX_VALUE_CHARS:
            text = text[: MAX_VALUE_CHARS - 1] + "…"
        return f'<tr><td>{label}</td><td colspan="3">{html.escape(text)}</td></tr>'
    leaves: list[str] = []
    branches: list[str] = []
    for child_name, child in items:
        rendered = _node_html(child_name, child, budget)
        (branches if rendered.startswith("<details") else leaves).append(rendered)
    table = f"<table>{''.join(leaves)}</table>" if leaves else ""
    summary = html.escape(head) + (f" <i>({count})</i>" if count else "")
    opened = " open" if open_ else ""
    return (
        f"<details{opened}><summary>{summary}</summary>"
        f'<div style="margin-left:1.5em">{table}{"".join(branches)}</div></details>'
    )
