"""Whether a model's leading dim is a batch of independent samples: found out, not assumed.

Dynamic batching joins requests along the leading dim and splits the answer back, which is right
only when each row's answer depends on that row alone. Most models with a variable leading dim
batch that way; some do not: a DETR-style tile classifier takes the 9 tiles of one round as its
"batch" and lets them attend to each other, so two rounds joined are one wrong round of 18.
The declared shapes cannot tell these apart; one comparison can: two sets of valid inputs run
alone and joined must give the same rows.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["rows_interact"]

logger = logging.getLogger(__name__)

#: How far a row may move when batched beside another before the rows count as dependent:
#: batched kernels round differently (measured ~1e-6 relative), a shared attention moves a tile
#: by up to 0.05.
_RTOL, _ATOL = 1e-3, 1e-4


def rows_interact(session: Any) -> str | None:
    """Why ``session``'s rows are not independent samples (``None`` when they are, or when it
    cannot be told: no two distinct valid input sets, or a run fails; the warm-up reports that).

    Runs two sets of found inputs (:func:`ferry.runtime.found_inputs`, seeds 0 and 1) alone and
    joined along the leading dim, and compares each joined output's rows with the lone runs'.
    """
    from ferry.runtime import found_inputs

    try:
        first = found_inputs(session, seed=0)
        second = found_inputs(session, first.shapes, seed=1)
    except Exception as e:
        logger.debug("rows probe: no inputs (%s)", e)
        return None
    a, b = first.feeds, second.feeds
    if all(np.array_equal(a[k], b[k]) for k in a):
        return None  # every input is fixed by its role (masks, lengths): nothing to compare
    try:
        alone_a, alone_b = session.run(a), session.run(b)
        joined = session.run({k: np.concatenate([a[k], b[k]]) for k in a})
    except Exception as e:
        return f"two calls joined along the leading dim do not run ({type(e).__name__}: {e})"
    return _difference(alone_a, alone_b, joined)


def _difference(
    a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray], joined: Mapping[str, np.ndarray]
) -> str | None:
    for name, together in joined.items():
        want = np.concatenate([np.asarray(a[name]), np.asarray(b[name])])
        got = np.asarray(together)
        if got.shape != want.shape:
            return (
                f"output {name!r} of two calls joined has shape {list(got.shape)}, not the "
                f"rows of each ({list(want.shape)})"
            )
        if got.dtype.kind not in "fc":
            if not np.array_equal(got, want):
                return f"output {name!r} changes when another call's rows run beside it"
            continue
        close = np.isclose(got, want, rtol=_RTOL, atol=_ATOL, equal_nan=True)
        if not close.all():
            worst = float(np.nanmax(np.abs(got.astype(np.float64) - want.astype(np.float64))))
            return (
                f"output {name!r} changes when another call's rows run beside it "
                f"(by up to {worst:.3g}): its rows depend on each other"
            )
    return None
