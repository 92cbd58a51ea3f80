"""The ctypes declarations match include/flashcl.h: a small C program compiled against the header prints
sizeof and offsetof of every struct and field, and the enum values; the bindings must agree on each."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from flashcl import _lib

HEADER_DIR = Path(os.environ.get("FLASHCL_INCLUDE_DIR", Path(__file__).resolve().parents[2] / "include"))


def _c_program() -> str:
    lines = ["#include <stddef.h>", "#include <stdio.h>", "#include <flashcl.h>", "int main(void) {"]
    for name, cls in _lib.STRUCTS.items():
        lines.append(f'  printf("{name} sizeof %zu\\n", sizeof({name}));')
        for field, _ in cls._fields_:
            lines.append(f'  printf("{name} {field} %zu %zu\\n", offsetof({name}, {field}), sizeof((({name} *)0)->{field}));')
    for const in _lib.CONSTANTS:
        lines.append(f'  printf("const {const} %lld\\n", (long long)({const}));')
    lines += ["  return 0;", "}"]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory):
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    assert cc, "a C compiler is needed to check the ctypes layout against include/flashcl.h"
    assert (HEADER_DIR / "flashcl.h").is_file(), f"include/flashcl.h not found in {HEADER_DIR} (set FLASHCL_INCLUDE_DIR)"
    d = tmp_path_factory.mktemp("layout")
    src, exe = d / "layout.c", d / "layout"
    src.write_text(_c_program())
    subprocess.run([cc, "-std=c11", "-Wall", "-Werror", f"-I{HEADER_DIR}", str(src), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    table = {}
    for line in out.splitlines():
        parts = line.split()
        table[tuple(parts[:2])] = [int(x) for x in parts[2:]]
    return table


@pytest.mark.parametrize("name", list(_lib.STRUCTS))
def test_struct_layout(c_layout, name):
    cls = _lib.STRUCTS[name]
    assert ctypes.sizeof(cls) == c_layout[(name, "sizeof")][0], f"sizeof({name})"
    for field, _ in cls._fields_:
        desc = getattr(cls, field)
        assert [desc.offset, desc.size] == c_layout[(name, field)], f"{name}.{field}: offset, size"


def test_every_field_declared():
    """Each struct of the header that the bindings declare has no field the bindings miss: the header's
    struct bodies list exactly the ctypes fields, in order."""
    text = (HEADER_DIR / "flashcl.h").read_text()
    import re

    for name, cls in _lib.STRUCTS.items():
        body = re.search(r"typedef struct %s \{(.*?)\} %s;" % (name, name), text, re.S)
        assert body, name
        code = re.sub(r"/\*.*?\*/", "", body.group(1), flags=re.S)
        fields = []
        for decl in code.split(";"):
            decl = decl.strip()
            if not decl:
                continue
            # "int64_t batch, num_heads" / "char kernel[64]" / "const char *cache_dir"
            head, *rest = decl.split(",")
            names = [head.split()[-1]] + [r.strip() for r in rest]
            fields += [re.sub(r"[\*\[].*|^\*+", "", n.lstrip("*")) for n in names]
        assert fields == [f for f, _ in cls._fields_], name


def test_constants(c_layout):
    for const, value in _lib.CONSTANTS.items():
        assert c_layout[("const", const)] == [value], const


def test_every_function_declared():
    """Every function include/flashcl.h exports has a ctypes signature here (a new one fails until wrapped)."""
    import re

    text = re.sub(r"/\*.*?\*/", "", (HEADER_DIR / "flashcl.h").read_text(), flags=re.S)
    names = set(re.findall(r"FCL_API[^;(]*?\b(fcl_\w+)\s*\(", text))
    assert names, "no FCL_API functions found in the header"
    assert names == set(_lib._SIGNATURES), (
        f"in the header only: {sorted(names - set(_lib._SIGNATURES))}; "
        f"in the bindings only: {sorted(set(_lib._SIGNATURES) - names)}"
    )


def test_descriptors_mirror_structs():
    """flashcl.Descriptor and KVAppendDescriptor declare every field of their C struct (a field added to the
    header, such as the sequence fields of 0.2, must reach the Python descriptor too)."""
    import dataclasses

    import flashcl

    for py, c in ((flashcl.Descriptor, _lib.fcl_attention_desc), (flashcl.KVAppendDescriptor, _lib.fcl_kv_append_desc)):
        assert {f.name for f in dataclasses.fields(py)} == {f for f, _ in c._fields_}, py.__name__
