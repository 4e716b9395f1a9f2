"""Type hints of the native module (private: attnforge.flashinfer is its only caller)."""

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

# A numpy array or a torch tensor (read through its public attributes).
Array = Any
# (address, shape, strides in elements, dtype name, CUDA ordinal or -1)
Descriptor = Tuple[int, List[int], List[int], str, int]

__version__: str

def cuda_available() -> bool: ...
def describe(obj: Array, name: str) -> Descriptor: ...

class RaggedPlan:
    def __init__(
        self,
        qo_indptr: List[int],
        kv_indptr: List[int],
        spec: Dict[str, Any],
        device: int,
        lazy: bool = False,
        graph: Optional[Tuple[int, int]] = None,
    ) -> None: ...
    def replan(
        self, qo_indptr: List[int], kv_indptr: List[int], spec: Dict[str, Any], stream: int
    ) -> None: ...
    def run(
        self,
        q: Array,
        k: Array,
        v: Array,
        o: Array,
        lse: Optional[Array],
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
        kv_fp8: Optional[str] = None,
        graph: Optional[Tuple[int, int, int, int]] = None,
        unsplit: bool = False,
        chunk_keys: Optional[int] = None,
    ) -> None: ...
    def replan(
        self,
        qo_indptr: List[int],
        kv_page_indptr: List[int],
        kv_page_indices: List[int],
        kv_last_page_len: List[int],
        page_size: int,
        kv_layout: str,
        spec: Dict[str, Any],
        stream: int,
        kv_fp8: Optional[str] = None,
    ) -> None: ...
    def run(
        self,
        q: Array,
        cache: Union[Array, Sequence[Array]],
        o: Array,
        lse: Optional[Array],
        stream: int,
        k_scale: Optional[List[float]] = None,
        v_scale: Optional[List[float]] = None,
    ) -> None: ...

def merge_state(
    v_a: Array,
    s_a: Array,
    v_b: Array,
    s_b: Array,
    v_out: Array,
    s_out: Array,
    stream: int,
) -> None: ...
def merge_states(
    v: Array, s: Array, v_out: Array, s_out: Array, stream: int
) -> None: ...
def append_paged_kv(
    k_new: Array,
    v_new: Array,
    append_indptr: List[int],
    cache: Union[Array, Sequence[Array]],
    kv_layout: str,
    kv_page_indptr: List[int],
    kv_page_indices: List[int],
    kv_last_page_len: List[int],
    stream: int,
    kv_fp8: Optional[str] = None,
) -> None: ...
