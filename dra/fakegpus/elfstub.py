"""The fake driver root's libraries as ELF shared objects: a real SONAME, no symbols.

A real driver root holds ELF shared objects, and every path a container takes to its libraries
reads them as such: ``ldconfig`` (which NVIDIA's ``update-ldcache`` hook runs in the container)
puts a file in the loader cache under the SONAME its dynamic section names, and skips anything
that is not ELF; ``ldconfig -p`` (which Triton parses to find libcuda) lists the cache;
``dlopen("libcuda.so.1")`` maps the file. ``shared_object`` writes the smallest object all three
accept: one PT_LOAD segment mapping the file, a PT_DYNAMIC segment whose dynamic section names
DT_SONAME, DT_HASH, DT_STRTAB, DT_SYMTAB, DT_STRSZ and DT_SYMENT, an empty symbol table (the
null symbol alone) and a PT_GNU_STACK that asks for no executable stack (glibc 2.41's dlopen
refuses an object that would need one). Section headers are there for the tools that read
sections: readelf, nm, file, and the link editor (Triton links its launcher with ``-lcuda``).

Faithful on those paths: the cache entry, the SONAME link, a dlopen by SONAME and a link with
``-lcuda`` behave as with the real library. It exports nothing, so binding a symbol of it
(``dlsym(h, "cuInit")``, or loading a program that calls cuInit) fails with "undefined symbol",
the failure of a driver that lacks the call; the local cluster's C-built fakes
(deploy/local/fakenvml) are what answer calls.

Sources: the System V ABI, generic part (gABI), chapters 4 "Object Files" (ELF header,
e_ident, section header, symbol table, string table) and 5 "Program Loading and Dynamic
Linking" (program header, PT_LOAD/PT_DYNAMIC, the dynamic section's tags, the hash table:
nbucket, nchain, bucket, chain); the machine numbers EM_X86_64 (62) and EM_AARCH64 (183) from
the System V AMD64 psABI and ARM's ELF for the Arm 64-bit Architecture (AArch64); PT_GNU_STACK
from the Linux Standard Base core specification. glibc's loader also needs a PT_LOAD whose
alignment is a multiple of the page size (64 KiB here, the largest aarch64 page) and a writable
dynamic segment (before 2.35 it relocates the dynamic section in place).
"""

from __future__ import annotations

import platform
import struct

#: e_machine by ``platform.machine()``: the psABIs' numbers.
MACHINES = {"x86_64": 62, "amd64": 62, "aarch64": 183, "arm64": 183}

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_PHDR = struct.Struct("<IIQQQQQQ")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_SYM = struct.Struct("<IBBHQQ")
_DYN = struct.Struct("<qQ")

_ET_DYN = 3
_EV_CURRENT = 1
_PT_LOAD, _PT_DYNAMIC, _PT_GNU_STACK = 1, 2, 0x6474E551
_PF_W, _PF_R = 2, 4
_SHT_PROGBITS, _SHT_STRTAB, _SHT_HASH, _SHT_DYNAMIC, _SHT_DYNSYM = 1, 3, 5, 6, 11
_SHF_WRITE, _SHF_ALLOC, _SHF_MERGE, _SHF_STRINGS = 1, 2, 0x10, 0x20
_DT_NULL, _DT_HASH, _DT_STRTAB, _DT_SYMTAB, _DT_STRSZ, _DT_SYMENT, _DT_SONAME = 0, 4, 5, 6, 10, 11, 14
#: A multiple of every page size glibc runs with (4 KiB x86-64; 4, 16 or 64 KiB aarch64).
_LOAD_ALIGN = 0x10000
_SECTION_NAMES = (".dynsym", ".hash", ".dynstr", ".dynamic", ".comment", ".shstrtab")


class UnsupportedMachineError(ValueError):
    """No ELF machine number is known for this architecture (the message names it)."""


def machine_number(machine: str | None = None) -> int:
    """The e_machine of `machine` (default: this one, ``platform.machine()``)."""
    name = platform.machine() if machine is None else machine
    try:
        return MACHINES[name.lower()]
    except KeyError:
        raise UnsupportedMachineError(
            f"no ELF machine number for {name!r}; known: {', '.join(sorted(MACHINES))}"
        ) from None


def _align(offset: int, to: int = 8) -> int:
    return -(-offset // to) * to


def shared_object(soname: str, machine: int, comment: str = "") -> bytes:
    """An ELF64 little-endian shared object for `machine` whose DT_SONAME is `soname`.

    `comment` goes into a .comment section (not loaded), to say what the file is.
    """
    if not soname or "\0" in soname or "/" in soname:
        raise ValueError(f"not a SONAME: {soname!r}")
    phnum = 3
    dynsym = _align(_EHDR.size + phnum * _PHDR.size)
    symbols = _SYM.pack(0, 0, 0, 0, 0, 0)  # the null symbol, index 0 (STN_UNDEF)
    hash_at = dynsym + len(symbols)
    # nbucket 1 (the loader divides by it), nchain 1 (one symbol); both chains end at once.
    hash_table = struct.pack("<4I", 1, 1, 0, 0)
    dynstr = hash_at + len(hash_table)
    strings = b"\0" + soname.encode() + b"\0"
    dynamic = _align(dynstr + len(strings))
    entries = (
        (_DT_SONAME, 1),
        (_DT_HASH, hash_at),
        (_DT_STRTAB, dynstr),
        (_DT_SYMTAB, dynsym),
        (_DT_STRSZ, len(strings)),
        (_DT_SYMENT, _SYM.size),
        (_DT_NULL, 0),
    )
    dyn = b"".join(_DYN.pack(tag, value) for tag, value in entries)
    loaded = dynamic + len(dyn)
    # Not loaded: the comment, the section names, the section headers.
    note = comment.encode().replace(b"\0", b" ") + b"\0"
    shstrtab = loaded + len(note)
    names = b"\0" + b"\0".join(name.encode() for name in _SECTION_NAMES) + b"\0"
    shoff = _align(shstrtab + len(names))

    def name_of(section: str) -> int:
        return names.index(b"\0" + section.encode() + b"\0") + 1

    rw = _PF_R | _PF_W
    phdrs = (
        _PHDR.pack(_PT_LOAD, rw, 0, 0, 0, loaded, loaded, _LOAD_ALIGN),
        _PHDR.pack(_PT_DYNAMIC, rw, dynamic, dynamic, dynamic, len(dyn), len(dyn), 8),
        _PHDR.pack(_PT_GNU_STACK, rw, 0, 0, 0, 0, 0, 16),
    )
    alloc = _SHF_ALLOC
    # (name, type, flags, address, offset, size, link, info, alignment, entry size); sh_link of
    # .dynsym, .dynamic: their strings (3); of .hash: its symbols (1); .dynsym's sh_info: one past
    # the last local symbol.
    sections = (
        (".dynsym", _SHT_DYNSYM, alloc, dynsym, dynsym, len(symbols), 3, 1, 8, _SYM.size),
        (".hash", _SHT_HASH, alloc, hash_at, hash_at, len(hash_table), 1, 0, 8, 4),
        (".dynstr", _SHT_STRTAB, alloc, dynstr, dynstr, len(strings), 0, 0, 1, 0),
        (".dynamic", _SHT_DYNAMIC, alloc | _SHF_WRITE, dynamic, dynamic, len(dyn), 3, 0, 8, _DYN.size),
        (".comment", _SHT_PROGBITS, _SHF_MERGE | _SHF_STRINGS, 0, loaded, len(note), 0, 0, 1, 1),
        (".shstrtab", _SHT_STRTAB, 0, 0, shstrtab, len(names), 0, 0, 1, 0),
    )
    null = _SHDR.pack(0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    shdrs = (null, *(_SHDR.pack(name_of(name), *fields) for name, *fields in sections))
    # e_ident: magic, ELFCLASS64, ELFDATA2LSB, EV_CURRENT, ELFOSABI_NONE, ABI version 0, padding.
    ident = b"\x7fELF" + bytes((2, 1, _EV_CURRENT, 0, 0)) + bytes(7)
    header = _EHDR.pack(
        ident, _ET_DYN, machine, _EV_CURRENT, 0, _EHDR.size, shoff, 0,
        _EHDR.size, _PHDR.size, phnum, _SHDR.size, len(shdrs), len(shdrs) - 1,
    )  # fmt: skip
    image = bytearray(shoff)
    image[: len(header)] = header
    image[_EHDR.size : _EHDR.size + phnum * _PHDR.size] = b"".join(phdrs)
    image[dynsym:hash_at] = symbols
    image[hash_at:dynstr] = hash_table
    image[dynstr : dynstr + len(strings)] = strings
    image[dynamic:loaded] = dyn
    image[loaded:shstrtab] = note
    image[shstrtab : shstrtab + len(names)] = names
    return bytes(image) + b"".join(shdrs)
