"""Shared fixtures: the OpenCL device (FLASHCL_TEST_DEVICE, as the C tests), a queue, a seeded RNG."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pyopencl as cl  # noqa: E402


def _devices():
    out = []
    for p in cl.get_platforms():
        try:
            out += p.get_devices()
        except cl.Error:
            pass
    return out


def pick_device() -> "cl.Device":
    devices = _devices()
    if not devices:
        pytest.exit("no OpenCL device found (is an ICD such as PoCL installed in /etc/OpenCL/vendors?)", 2)
    want = os.environ.get("FLASHCL_TEST_DEVICE")
    if want:
        if want.isdigit():
            return devices[int(want)]
        for d in devices:
            if want.lower() in d.name.lower():
                return d
        pytest.exit(f"FLASHCL_TEST_DEVICE={want!r} matches no device", 2)
    gpus = [d for d in devices if d.type & cl.device_type.GPU]
    return (gpus or devices)[0]


@pytest.fixture(scope="session")
def device():
    return pick_device()


@pytest.fixture(scope="session")
def cl_context(device):
    return cl.Context([device])


@pytest.fixture(scope="session")
def queue(cl_context):
    return cl.CommandQueue(cl_context)


@pytest.fixture
def rng(request):
    seed = int(os.environ.get("FLASHCL_TEST_SEED", np.random.SeedSequence().entropy % 2**32))
    request.node.user_properties.append(("seed", seed))
    print(f"seed {seed} (FLASHCL_TEST_SEED={seed} repeats it)")
    return np.random.default_rng(seed)


def pytest_report_header(config):
    d = pick_device()
    import flashcl

    try:
        lib = f"{flashcl.library_path()} (version {flashcl.version()})"
    except flashcl.LibraryNotFoundError as e:
        lib = str(e)
    return [f"OpenCL device: {d.name} ({d.platform.name}, {d.version})", f"libflashcl: {lib}"]


def to_host(a) -> np.ndarray:
    """A host copy of any pyopencl array, strided views included (pyopencl's get() takes contiguous ones)."""
    if a.flags.c_contiguous:
        return a.get()
    raw = np.empty(a.base_data.size, np.uint8)
    cl.enqueue_copy(a.queue, raw, a.base_data, wait_for=a.events)
    return np.ndarray(a.shape, a.dtype, buffer=raw, offset=a.offset, strides=a.strides).copy()
