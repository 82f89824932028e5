"""The fake NVML as a shared library: libnvidia-ml.so.1 exporting every function of nvml.h.

The functions' names come from nvml.h as go-nvml ships it, at the version NVIDIA's plugin is
built with (deploy/local/nvidiabin/go.mod), so the library offers whatever NVIDIA's plugin or
pynvml may look up. Each exported function is a jump through a slot (loader.c), written here as
assembly: a jump keeps the caller's registers and stack as they are, so one stub forwards any
signature without this file knowing it. The library is built with gcc into the cache beside the
cluster's binaries, keyed by what it is built from, in about a second.
"""

from __future__ import annotations

import hashlib
import json
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from localcluster.binaries import NVIDIA
from localcluster.gomodule import BuildError, cache_root

HERE = Path(__file__).resolve().parent
LOADER = HERE / "loader.c"
GO_NVML = "github.com/NVIDIA/go-nvml"
SONAME = "libnvidia-ml.so.1"

# A declaration of nvml.h: `nvmlReturn_t DECLDIR nvmlInit_v2(void);`,
# `const DECLDIR char* nvmlErrorString(...)`.
_DECLARATION = re.compile(r"\bDECLDIR\b[^;(]*?\b(nvml\w+)\s*\(")
_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.DOTALL)


def nvml_header() -> Path:
    """nvml.h of the go-nvml module NVIDIA's plugin pins, downloaded from the module proxy if need be."""
    if shutil.which("go") is None:
        raise BuildError(f"the Go toolchain is needed to fetch nvml.h ({GO_NVML}) for the fake NVML")
    done = subprocess.run(
        ["go", "mod", "download", "-json", GO_NVML],
        cwd=NVIDIA.directory,
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        directory = Path(json.loads(done.stdout)["Dir"])
    except (ValueError, KeyError):
        raise BuildError(f"go mod download {GO_NVML} failed:\n{done.stderr or done.stdout}") from None
    header = directory / "pkg/nvml/nvml.h"
    if not header.is_file():
        raise BuildError(f"{GO_NVML} has no pkg/nvml/nvml.h at {directory}")
    return header


def function_names(header: str) -> list[str]:
    """Every function nvml.h declares, once each, in the header's order (versioned and legacy names alike)."""
    return list(dict.fromkeys(_DECLARATION.findall(_COMMENT.sub("", header))))


def generated_source(names: list[str]) -> str:
    """The C file that defines the names, the slots and, in assembly, the exported functions and stubs."""
    if not names:
        raise BuildError("nvml.h declares no function: is it the header of NVML?")
    lines = [
        "/* Generated from nvml.h by deploy/local/fakenvml/library.py: what the fake NVML exports. */",
        '#define HIDDEN __attribute__((visibility("hidden")))',
        f"HIDDEN const unsigned fakenvml_total = {len(names)};",
        "HIDDEN const char *const fakenvml_names[] = {",
        *(f'    "{name}",' for name in names),
        "};",
        *(f"extern HIDDEN char fakenvml_stub_{i}[];" for i in range(len(names))),
        "HIDDEN void *const fakenvml_stub[] = {",
        *(f"    fakenvml_stub_{i}," for i in range(len(names))),
        "};",
        "HIDDEN void *fakenvml_slot[] = {",
        *(f"    fakenvml_stub_{i}," for i in range(len(names))),
        "};",
        "__asm__(",
        '    ".text\\n"',
    ]
    for i, name in enumerate(names):
        # The exported function: a jump through its slot, the caller's arguments untouched.
        lines += _asm(name, f"jmp *fakenvml_slot+{8 * i}(%rip)", exported=True)
        # Its stub: keep the argument registers, ask where to go, restore them and jump there.
        # Seven pushes after the call's return address leave the stack 16-byte aligned for the call.
        lines += _asm(
            f"fakenvml_stub_{i}",
            "push %rdi; push %rsi; push %rdx; push %rcx; push %r8; push %r9; push %rax",
            f"mov ${i}, %edi",
            "call fakenvml_resolve",
            "mov %rax, %r11",
            "pop %rax; pop %r9; pop %r8; pop %rcx; pop %rdx; pop %rsi; pop %rdi",
            "jmp *%r11",
            exported=False,
        )
    lines.append(");")
    return "\n".join(lines) + "\n"


def _asm(symbol: str, *instructions: str, exported: bool) -> list[str]:
    visibility = f".globl {symbol}" if exported else f".globl {symbol}\\n.hidden {symbol}"
    body = "\\n".join(instructions)
    return [
        f'    "{visibility}\\n.type {symbol}, @function\\n{symbol}:\\n{body}\\n.size {symbol}, .-{symbol}\\n"'
    ]


def ensure_library(log: bool = True) -> Path:
    """Build the fake libnvidia-ml.so.1 on first use (or when its sources changed); its path in the cache."""
    if platform.machine() != "x86_64":
        raise BuildError(f"the fake NVML's stubs are x86-64 assembly; this machine is {platform.machine()}")
    header = nvml_header()
    source = generated_source(function_names(header.read_text(errors="replace"))) + LOADER.read_text()
    key = hashlib.sha256(source.encode()).hexdigest()[:12]
    return compiled_library(
        f"the fake NVML from {header}",
        cache_root() / "fakenvml" / key,
        SONAME,
        source,
        "fakenvml.c",
        libs=("-ldl", "-lpthread"),
        log=log,
    )


def compiled_library(
    what: str,
    directory: Path,
    soname: str,
    source: str,
    filename: str,
    flags: tuple[str, ...] = (),
    libs: tuple[str, ...] = (),
    log: bool = True,
) -> Path:
    """`directory`/`soname`, a shared object gcc builds from the C `source` (named `filename` in its
    messages) on first use; `directory` is keyed by what it is built from, so a change builds anew."""
    library = directory / soname
    if library.is_file():
        return library
    if shutil.which("gcc") is None:
        raise BuildError(f"gcc is needed to build {what} ({soname})")
    if log:
        print(f"building {what} into {directory}", file=sys.stderr, flush=True)
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        (Path(tmp) / filename).write_text(source)
        built = Path(tmp) / soname
        compiled = subprocess.run(
            [
                "gcc",
                "-shared",
                "-fPIC",
                "-O2",
                "-Wall",
                "-fvisibility=hidden",
                *flags,
                f"-Wl,-soname,{soname}",
                "-o",
                str(built),
                str(Path(tmp) / filename),
                *libs,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if compiled.returncode != 0:
            raise BuildError(f"gcc failed to build {what}:\n{compiled.stderr}")
        built.replace(library)
    return library
