"""Tensors the owner shares with the sandbox's child, and the memory they live in.

    with slot_memory(device):           # owner: tensors to share are allocated here (CUDA: a pool of their own)
        a = torch.empty(...)
    meta, fds = export(slots)           # owner: slots = [(inputs tuple, flat output)], plain data + descriptors
    slots = rebuild(meta, fds)          # child: the same tensors, on the same memory

What crosses, and what the child can reach through it:
- CPU: each storage is moved, in place, into a memfd of its own, sealed against shrinking and growing
  (``F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL``), and that descriptor crosses the socketpair with the request
  (SCM_RIGHTS, ``wire.send``). The child maps those storages and nothing else of the owner's; no listener is started
  in the owner (torch.multiprocessing would start multiprocessing's resource sharer, which unpickles what any
  holder of the authkey sends it). The seals matter because the child owns the descriptor: on a plain shared-memory
  file (torch's own strategy) ``ftruncate(fd, 0)`` in the child made the owner's next touch of the slot a SIGBUS,
  which killed the grader; a sealed memfd refuses it (EPERM). A hole punched in it reads as zeros (the grade fails,
  the grader lives).
- CUDA: a storage crosses as its CUDA IPC handle, and a handle maps the whole cudaMalloc'd block the storage lives
  in: with the caching allocator, a segment that may hold other tensors of the owner (the grader's private copies of
  the inputs, its references). So every CUDA tensor to share must be allocated under ``slot_memory(device)``, a
  ``torch.cuda.MemPool`` of the sandbox's own whose segments hold shared tensors only; ``export`` refuses any other
  CUDA tensor (ValueError). The segments are 2 MiB multiples, which the CUDA guide names as the size below which
  cudaMalloc itself may sub-allocate.
"""

from __future__ import annotations

import contextlib
import fcntl
import os

import torch

_POOLS: dict[int, torch.cuda.MemPool] = {}  # device index -> the pool whose segments hold shared tensors only


@contextlib.contextmanager
def slot_memory(device: torch.device | str):
    """Allocations made in this block on a CUDA ``device`` come from the sandbox's own pool (no grader tensor is
    ever placed in its segments); on the CPU it does nothing (each CPU storage is shared alone)."""
    device = torch.device(device)
    if device.type != "cuda":
        yield
        return
    index = device.index if device.index is not None else torch.cuda.current_device()
    pool = _POOLS.get(index)
    if pool is None:
        pool = _POOLS[index] = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool, device=torch.device("cuda", index)):
        yield


def pool_segments(device: torch.device) -> list[tuple[int, int]]:
    """(address, size) of every segment of the slot pool on ``device``."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    pool = _POOLS.get(index)
    if pool is None:
        return []
    return [
        (s["address"], s["total_size"])
        for s in torch.cuda.memory_snapshot()
        if s.get("device") == index and tuple(s.get("segment_pool_id", ())) == tuple(pool.id)
    ]


def _storages(slots) -> list[torch.UntypedStorage]:
    seen: dict[int, torch.UntypedStorage] = {}
    for inputs, out in slots:
        for t in (*inputs, out):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"a slot holds a {type(t).__name__}, not a tensor")
            st = t.untyped_storage()
            seen.setdefault(st.data_ptr(), st)
    return list(seen.values())


def _tensor_meta(t: torch.Tensor, index: dict[int, int]) -> dict:
    return {
        "storage": index[t.untyped_storage().data_ptr()],
        "dtype": str(t.dtype).removeprefix("torch."),
        "size": list(t.shape),
        "stride": list(t.stride()),
        "offset": t.storage_offset(),
    }


SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


def _sealed_fd(st: torch.UntypedStorage) -> tuple[int, int]:
    """(descriptor, bytes) of a CPU storage's memory, a memfd sealed against resizing; a storage not yet in one is
    moved there first, in place (every tensor on it follows), so a storage bound to both workers is moved once."""
    if st.is_shared():
        fd, size = st._share_fd_cpu_()
        if fcntl.fcntl(fd, fcntl.F_GET_SEALS) & SEALS == SEALS:
            return fd, size
    n = st.nbytes()
    memfd = os.memfd_create("gemmlab-slot", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(memfd, n)
        fcntl.fcntl(memfd, fcntl.F_ADD_SEALS, SEALS)
        mapped = torch.UntypedStorage._new_shared_fd_cpu(memfd, n)  # torch keeps a duplicate of the descriptor
    finally:
        os.close(memfd)
    mapped.copy_(st)
    st._swap_data_ptr_(mapped)  # st now lives in the memfd; ``mapped`` holds (and frees) the old memory
    return st._share_fd_cpu_()


def export(slots) -> tuple[dict, list[int]]:
    """Plain data describing ``slots`` and the descriptors to send with it (CPU storages); the storages are kept
    by the caller's tensors. Raises ValueError for a CUDA tensor outside ``slot_memory``."""
    storages = _storages(slots)
    segments: dict = {}
    for st in storages:
        if st.device.type == "cuda":
            inside = segments.setdefault(st.device, pool_segments(st.device))
            p = st.data_ptr()
            if not any(a <= p and p + st.nbytes() <= a + n for a, n in inside):
                raise ValueError(
                    "a CUDA tensor shared with the sandbox was not allocated under "
                    "gemmlab.sandbox.slot_memory(device): its IPC handle would expose the whole "
                    "allocator segment it lives in"
                )
    metas, fds = [], []
    for st in storages:
        if st.nbytes() == 0:
            metas.append({"kind": "empty", "device": str(st.device)})
        elif st.device.type == "cpu":
            fd, size = _sealed_fd(st)
            metas.append({"kind": "fd", "fd": len(fds), "nbytes": size})
            fds.append(fd)
        elif st.device.type == "cuda":
            dev, handle, size, offset, ref_handle, ref_offset, event, event_sync = st._share_cuda_()
            metas.append(
                {
                    "kind": "cuda",
                    "device": dev,
                    "handle": handle.hex(),
                    "nbytes": size,
                    "offset": offset,
                    "ref_handle": ref_handle.hex(),
                    "ref_offset": ref_offset,
                    "event": event.hex() if event else None,
                    "event_sync": bool(event_sync),
                }
            )
        else:
            raise ValueError(f"tensors on {st.device} cannot be shared with the sandbox")
    index = {st.data_ptr(): i for i, st in enumerate(storages)}
    return (
        {
            "storages": metas,
            "slots": [
                {"inputs": [_tensor_meta(t, index) for t in inputs], "out": _tensor_meta(out, index)}
                for inputs, out in slots
            ],
        },
        fds,
    )


def _storage(meta: dict, fds: list[int]) -> torch.UntypedStorage:
    kind = meta["kind"]
    if kind == "empty":
        return torch.UntypedStorage(0, device=meta["device"])
    if kind == "fd":
        return torch.UntypedStorage._new_shared_fd_cpu(fds[meta["fd"]], meta["nbytes"])
    torch.cuda.init()
    event = bytes.fromhex(meta["event"]) if meta["event"] else None
    return torch.UntypedStorage._new_shared_cuda(
        meta["device"],
        bytes.fromhex(meta["handle"]),
        meta["nbytes"],
        meta["offset"],
        bytes.fromhex(meta["ref_handle"]),
        meta["ref_offset"],
        event,
        meta["event_sync"],
    )


def rebuild(meta: dict, fds: list[int]) -> list[tuple[tuple[torch.Tensor, ...], torch.Tensor]]:
    """The child's side of ``export``: the slots as tensors on the shared memory (the descriptors are closed)."""
    try:
        storages = [_storage(m, fds) for m in meta["storages"]]
    finally:
        for fd in fds:
            os.close(fd)

    def tensor(m: dict) -> torch.Tensor:
        st = storages[m["storage"]]
        dtype = getattr(torch, m["dtype"])
        return torch.empty(0, dtype=dtype, device=st.device).set_(st, m["offset"], m["size"], m["stride"])

    return [(tuple(tensor(m) for m in s["inputs"]), tensor(s["out"])) for s in meta["slots"]]
