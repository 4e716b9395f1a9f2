"""Type hints of the native module (private: attnforge.flashinfer is its only caller)."""

from typing import Any, Dict, List, Optional, Sequence, Tuple

# (address, shape, strides in elements, dtype name, CUDA ordinal or -1)
ArrayArg = Tuple[int, Sequence[int], Sequence[int], str, int]

__version__: str

def cuda_available() -> bool: ...

class RaggedPlan:
    def __init__(
        self,
        qo_indptr: List[int],
        kv_indptr: List[int],
        spec: Dict[str, Any],
        device: int,
        lazy: bool = False,
    ) -> None: ...
    def run(
        self,
        q: ArrayArg,
        k: ArrayArg,
        v: ArrayArg,
        o: ArrayArg,
        lse: Optional[ArrayArg],
        stream: int,
    ) -> None: ...

class PagedPlan:
    def __init__(
        self,
        qo_indptr: List[int],
        kv_page_indptr: List[int],
        kv_page_indices: List[int],
        kv_last_page_len: List[int],
        page_size: int,
        kv_layout: str,
        spec: Dict[str, Any],
        device: int,
    ) -> None: ...
    def run(
        self,
        q: ArrayArg,
        cache: List[ArrayArg],
        o: ArrayArg,
        lse: Optional[ArrayArg],
        stream: int,
    ) -> None: ...

def merge_state(
    v_a: ArrayArg,
    s_a: ArrayArg,
    v_b: ArrayArg,
    s_b: ArrayArg,
    v_out: ArrayArg,
    s_out: ArrayArg,
    stream: int,
) -> None: ...
def merge_states(
    v: ArrayArg, s: ArrayArg, v_out: ArrayArg, s_out: ArrayArg, stream: int
) -> None: ...
def append_paged_kv(
    k_new: ArrayArg,
    v_new: ArrayArg,
    append_indptr: List[int],
    cache: List[ArrayArg],
    kv_layout: str,
    kv_page_indptr: List[int],
    kv_page_indices: List[int],
    kv_last_page_len: List[int],
    stream: int,
) -> None: ...
