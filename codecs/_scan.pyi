"""Depth and element limits checked before parsing, in C (codecs/_scan.c); see scan.py."""

from inferwire.codecs.errors import DepthLimitError, ElementBudgetError
from inferwire.codecs.framing import BytesLike

API_VERSION: int

def configure(
    depth_error: type[DepthLimitError], budget_error: type[ElementBudgetError], /
) -> None: ...
def check_json(data: BytesLike, max_depth: int, max_elements: int, /) -> None: ...
def check_msgpack(data: BytesLike, max_depth: int, max_elements: int, /) -> None: ...
