"""The one exception a TFLite translator raises, in either direction."""

from __future__ import annotations

__all__ = ["Unsupported"]


class Unsupported(Exception):
    """A translator cannot handle this node or op as it is (the message says why).

    Raised by the ONNX -> TFLite lowering's translators and the TFLite -> ONNX translation's
    alike; the driver of each collects them, so that one :class:`~ferry.errors.UnsupportedOpError`
    names every op that cannot be handled, and never lets one escape.
    """
