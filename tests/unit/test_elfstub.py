"""The fake driver root's ELF stand-ins, read by the real tools: readelf, ldconfig and the loader."""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dra.fakegpus import node as fakegpus
from dra.fakegpus.elfstub import UnsupportedMachineError, machine_number, shared_object

VERSION = "580.95.05"
#: ldconfig's name for each machine's 64-bit libraries in `ldconfig -p`.
CACHE_FLAGS = {62: "libc6,x86-64", 183: "libc6,AArch64"}


def _tool(name: str) -> str:
    found = shutil.which(name, path=f"{os.environ.get('PATH', os.defpath)}:/usr/sbin:/sbin")
    if found is None:
        pytest.skip(f"needs {name}")
    return found


def _cached(libs: Path, cache: Path) -> list[str]:
    """`ldconfig -p` after ldconfig ran over libs (and its trusted folders) into cache."""
    ldconfig = _tool("ldconfig")
    # As update-ldcache does in a container: the mounted folders, the cache rebuilt.
    subprocess.run(
        [ldconfig, "-C", str(cache), "-f", "/dev/null", str(libs)], check=True, capture_output=True
    )
    listed = subprocess.run([ldconfig, "-p", "-C", str(cache)], capture_output=True, text=True, check=True)
    return listed.stdout.splitlines()


def _stub(directory: Path, stem: str = "libcuda", machine: int | None = None) -> Path:
    path = directory / f"{stem}.so.{VERSION}"
    path.write_bytes(shared_object(f"{stem}.so.1", machine_number() if machine is None else machine))
    return path


@pytest.mark.parametrize(("machine", "name"), [(62, "Advanced Micro Devices X86-64"), (183, "AArch64")])
def test_readelf_reads_the_soname_an_empty_symbol_table_and_no_executable_stack(
    tmp_path: Path, machine: int, name: str
) -> None:
    path = _stub(tmp_path, "libnvidia-ml", machine)
    out = subprocess.run(
        [_tool("readelf"), "-W", "-h", "-l", "-d", "--dyn-syms", str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stderr == ""
    assert "Type:                              DYN (Shared object file)" in out.stdout
    assert f"Machine:                           {name}" in out.stdout
    assert "Library soname: [libnvidia-ml.so.1]" in out.stdout
    assert "Symbol table '.dynsym' contains 1 entry:" in out.stdout
    stack = next(line.split() for line in out.stdout.splitlines() if "GNU_STACK" in line)
    assert stack[-2] == "RW"


def test_ldconfig_makes_the_soname_link_and_lists_it_in_the_cache(tmp_path: Path) -> None:
    libs = tmp_path / "lib"
    libs.mkdir()
    for stem in fakegpus.STAND_IN_LIBRARIES:
        _stub(libs, stem)
    listed = _cached(libs, tmp_path / "ld.so.cache")
    flags = CACHE_FLAGS[machine_number()]
    for stem in fakegpus.STAND_IN_LIBRARIES:
        assert os.readlink(libs / f"{stem}.so.1") == f"{stem}.so.{VERSION}"
        assert f"\t{stem}.so.1 ({flags}) => {libs}/{stem}.so.1" in listed


def test_ldconfig_skips_a_text_stand_in(tmp_path: Path) -> None:
    # Why the stand-ins are ELF: the text files written before are not in the cache.
    libs = tmp_path / "lib"
    libs.mkdir()
    (libs / f"libcuda.so.{VERSION}").write_text(f"dra-gpu fake GPUs: stand-in for libcuda.so.{VERSION}\n")
    listed = _cached(libs, tmp_path / "ld.so.cache")
    assert not [line for line in listed if str(libs) in line]


def test_the_loader_maps_it_by_path_and_by_soname_and_it_has_no_symbols(tmp_path: Path) -> None:
    path = _stub(tmp_path)
    library = ctypes.CDLL(str(path))
    with pytest.raises(AttributeError, match="undefined symbol: cuInit"):
        library.cuInit  # noqa: B018 - the lookup is the test
    (tmp_path / "libcuda.so.1").symlink_to(path.name)
    # By SONAME, as a CUDA program opens its driver: the loader reads LD_LIBRARY_PATH at start.
    program = "import ctypes; ctypes.CDLL('libcuda.so.1'); print('loaded')"
    run = subprocess.run(
        [sys.executable, "-c", program],
        env={**os.environ, "LD_LIBRARY_PATH": str(tmp_path)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert (run.returncode, run.stdout, run.stderr) == (0, "loaded\n", "")


def test_a_library_links_with_lcuda_and_binding_its_call_fails_as_an_undefined_symbol(tmp_path: Path) -> None:
    # Triton's path: its launcher is linked with -lcuda (through libcuda.so), then loaded.
    path = _stub(tmp_path)
    (tmp_path / "libcuda.so").symlink_to(path.name)
    (tmp_path / "libcuda.so.1").symlink_to(path.name)
    source = tmp_path / "launcher.c"
    source.write_text("int cuInit(unsigned int flags);\nint launch(void) { return cuInit(0); }\n")
    launcher = tmp_path / "launcher.so"
    subprocess.run(
        [_tool("gcc"), "-shared", "-fPIC", "-o", str(launcher), str(source), f"-L{tmp_path}", "-lcuda"],
        check=True,
        capture_output=True,
    )
    # ctypes binds every symbol at load (RTLD_NOW): libcuda.so.1 is found and mapped, cuInit is not there.
    run = subprocess.run(
        [sys.executable, "-c", f"import ctypes; ctypes.CDLL({str(launcher)!r})"],
        env={**os.environ, "LD_LIBRARY_PATH": str(tmp_path)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 1
    assert run.stderr.splitlines()[-1] == f"OSError: {launcher}: undefined symbol: cuInit"


def test_the_bytes_are_the_same_every_time() -> None:
    # The driver root is rewritten only when its files change: a fixed image keeps it untouched.
    assert shared_object("libcuda.so.1", 62) == shared_object("libcuda.so.1", 62)
    assert shared_object("libcuda.so.1", 62) != shared_object("libcuda.so.1", 183)


@pytest.mark.parametrize(
    ("machine", "number"), [("x86_64", 62), ("AMD64", 62), ("aarch64", 183), ("arm64", 183)]
)
def test_machine_numbers(machine: str, number: int) -> None:
    assert machine_number(machine) == number


def test_an_unknown_machine_is_named() -> None:
    with pytest.raises(UnsupportedMachineError) as err:
        machine_number("ppc64le")
    assert str(err.value) == "no ELF machine number for 'ppc64le'; known: aarch64, amd64, arm64, x86_64"


@pytest.mark.parametrize("soname", ["", "lib/cuda.so.1", "libcuda\0.so.1"])
def test_a_soname_that_is_no_file_name_is_refused(soname: str) -> None:
    with pytest.raises(ValueError, match="not a SONAME"):
        shared_object(soname, 62)


def test_the_driver_root_gets_elf_libraries_and_their_links(tmp_path: Path) -> None:
    fakegpus.stand_in_libraries(tmp_path, VERSION)
    for stem in fakegpus.STAND_IN_LIBRARIES:
        library = tmp_path / f"{stem}.so.{VERSION}"
        assert library.read_bytes() == shared_object(
            f"{stem}.so.1", machine_number(), f"dra-gpu fake GPUs: stand-in for {library.name}, no symbols"
        )
        assert library.stat().st_mode & 0o777 == 0o755
        assert os.readlink(tmp_path / f"{stem}.so.1") == library.name
    ctypes.CDLL(str(tmp_path / "libnvidia-ml.so.1"))


def test_a_library_given_under_libraries_is_copied_instead(tmp_path: Path) -> None:
    sources, libs = tmp_path / "libraries", tmp_path / "lib"
    sources.mkdir()
    (sources / "libcuda.so.1").write_bytes(b"\x7fELF the C-built fake")
    fakegpus.stand_in_libraries(libs, VERSION, sources=sources)
    assert (libs / f"libcuda.so.{VERSION}").read_bytes() == b"\x7fELF the C-built fake"
    assert (libs / f"libnvidia-ml.so.{VERSION}").read_bytes()[:4] == b"\x7fELF"
    # Given later, it replaces the stand-in.
    (sources / "libnvidia-ml.so.1").write_bytes(b"\x7fELF the fake NVML")
    fakegpus.stand_in_libraries(libs, VERSION, sources=sources)
    assert (libs / f"libnvidia-ml.so.{VERSION}").read_bytes() == b"\x7fELF the fake NVML"


def test_a_machine_without_an_elf_number_gets_text_saying_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(platform, "machine", lambda: "s390x")
    fakegpus.stand_in_libraries(tmp_path, VERSION, ("libcuda",))
    assert (tmp_path / f"libcuda.so.{VERSION}").read_text() == (
        f"dra-gpu fake GPUs: stand-in for libcuda.so.{VERSION} (not an ELF object: no ELF machine number "
        "for 's390x'; known: aarch64, amd64, arm64, x86_64)\n"
    )
    assert os.readlink(tmp_path / "libcuda.so.1") == f"libcuda.so.{VERSION}"
