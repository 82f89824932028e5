"""Hostile input (issue 26): every reproducer is a clear one-line error within 2 s and 200 MB.

Each decoder runs in a child process under RLIMIT_AS and a 2 s timer that start after the
imports, so a hang is a killed child and a memory blow-up a MemoryError, both failures here,
never a stuck test run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import pytest

from dra import documents
from dra.adapters import kube
from dra.adapters.nodefiles import ensure_dir, open_lock
from dra.core import config as coreconfig
from dra.daemon.sockets import owner_only
from dra.model.quoting import quote
from dra.webhook import admission

LIMIT_BYTES = 200 * 2**20
LIMIT_SECONDS = 2.0
DRIVER = "gpu.nvidia.com"

#: Nine levels of nine aliases: 9**9 (387 million) values once expanded.
LAUGHS = "a0: &a0 [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 10)
)
DEEP_YAML = "[" * 20_000
DEEP_JSON = "[" * 3_000 + "]" * 3_000


def bounded(
    call: str, setup: str = "from dra import cli", seconds: float = LIMIT_SECONDS, memory: int = LIMIT_BYTES
) -> tuple[int, str]:
    """Run `call` in a child under the limits (after `setup`'s imports): (exit status, its stderr).

    What it prints (--check-config's settings before the error, say) is only checked for tracebacks.
    """
    limits = (
        "import resource, signal, sys",
        setup,
        f"resource.setrlimit(resource.RLIMIT_AS, ({memory}, {memory}))",
        f"signal.setitimer(signal.ITIMER_REAL, {seconds})",
    )
    with tempfile.NamedTemporaryFile("w", suffix=".py") as program:
        # A file, not -c: the hostile documents are longer than an argument may be.
        program.write("\n".join(limits) + "\n" + textwrap.dedent(call))
        program.flush()
        done = subprocess.run([sys.executable, program.name], capture_output=True, text=True, timeout=120)
    output = done.stderr.strip()
    assert done.returncode != -14, f"still running after {seconds} s"
    assert "MemoryError" not in output, f"over {memory} bytes: {output[-500:]}"
    assert "Traceback" not in output + done.stdout, output[-2000:]
    return done.returncode, output or done.stdout.strip()


def refusal(call: str, setup: str, error: str) -> str:
    """The message of the `error` that `call` raises under the limits."""
    code, output = bounded(f"try:\n    {call}\nexcept {error} as err:\n    sys.exit(str(err))", setup)
    assert code == 1
    return output


#: The modules the commands import when they run: imported before the limits, which are the decoding's.
COMMANDS = (
    "from dra import cli\n"
    "import dra.deviceplugin.daemon, dra.deviceplugin.setup, dra.explain.command, dra.kubeletplugin.daemon"
)


def one_line_error(argv: list[str]) -> str:
    """The one error line `dra-gpu ARGV` exits with, non-zero, under the limits (after argparse's usage)."""
    code, output = bounded(f"sys.exit(cli.main({argv!r}))", COMMANDS)
    assert code != 0
    *usage, line = output.splitlines()
    assert all(u.startswith(("usage:", " ")) for u in usage), output
    assert len(line) < 600, line
    return line


def _file(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# -- every YAML loader: aliases, depth, devices, size ----------------------------------------


def _loaders(path: str) -> dict[str, list[str]]:
    return {
        "explain": ["explain", "--claim", path, "--fake-gpus", "h100x8"],
        "device-plugin config": ["device-plugin", f"--config-file={path}", "--check-config"],
        "fake profile": ["device-plugin", "--check-config", f"--fake-gpus={path}"],
    }


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        pytest.param(LAUGHS, "expands (through aliases) to more than", id="billion-laughs"),
        pytest.param(DEEP_YAML, "nested deeper than 100 levels", id="20000-brackets"),
        pytest.param("a: " + "1" * 5000, "an integer of more than 4300 digits", id="long-integer"),
    ],
)
def test_every_yaml_loader_refuses_hostile_documents(tmp_path: Path, text: str, complaint: str) -> None:
    path = _file(tmp_path, "hostile.yaml", text)
    for what, argv in _loaders(path).items():
        assert complaint in one_line_error(argv), what
    setup = "from pathlib import Path\nfrom dra.kubeletplugin.miglayout import MigLayoutError, load_configs"
    assert complaint in refusal(f"load_configs(Path({path!r}))", setup, "MigLayoutError")


def test_an_alias_rendered_in_a_message_is_refused_before_the_message(tmp_path: Path) -> None:
    # The aliased value is what the message would quote: a profile whose gpus are the laughs.
    profile = _file(tmp_path, "profile.yaml", LAUGHS + "gpus: *a9\n")
    assert "expands (through aliases)" in one_line_error(
        ["device-plugin", "--check-config", f"--fake-gpus={profile}"]
    )


def test_devices_and_huge_files_are_not_config_files(tmp_path: Path) -> None:
    for argv in _loaders("/dev/zero").values():
        if argv[0] != "explain":  # explain takes what is not a file for a cluster name
            line = one_line_error(argv)
            assert (
                "/dev/zero is a character device, not a regular file" in line
                or "'/dev/zero' is neither" in line
            )
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (documents.MAX_FILE_BYTES + 1))
    assert "larger than" in one_line_error(["device-plugin", f"--config-file={big}", "--check-config"])


def test_text_that_is_not_utf8_names_its_file_and_byte(tmp_path: Path) -> None:
    bad = tmp_path / "named.yaml"
    bad.write_bytes(b"version: \xff")
    with pytest.raises(documents.DocumentError, match=rf"^config x: {bad}: not UTF-8 text \(byte 9\)$"):
        documents.read_text(bad, "config x")


# -- a directory, a FIFO or a device where a file belongs (issue 46) -----------------------


def _not_files(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    directory = tmp_path / "dir"
    directory.mkdir()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    return {
        "dir": (directory, "a directory"),
        "fifo": (fifo, "a FIFO"),
        "zero": (Path("/dev/zero"), "a character device"),
    }


@pytest.mark.parametrize("what", ["dir", "fifo", "zero"])
def test_what_is_no_regular_file_is_refused_unopened_naming_its_path(tmp_path: Path, what: str) -> None:
    path, kind = _not_files(tmp_path)[what]
    refused = f"{path} is {kind}, not a regular file"
    for argv in (
        ["device-plugin", "--check-config", "--config-file", str(path)],
        ["discover", "--fake-gpus", "h100x8", "--mig-config-file", str(path), "--mig-config", "x"],
        ["explain", "--kubeconfig", str(path), "--claim", "ns/c"],
        ["top", "--kubeconfig", str(path), "--once", "true"],
    ):
        line = one_line_error(argv)
        assert refused in line, (argv, line)
    with pytest.raises(documents.DocumentError, match=f"^x: {refused}$"):
        documents.read_file(path, "x")


def test_the_fake_gpus_files_that_are_no_regular_files_neither_block_nor_crash(tmp_path: Path) -> None:
    # The XID watch opens the events file each time it looks; the control file of processes is a
    # document of its own, read through the bounded reader.
    fifo, directory = tmp_path / "fifo", tmp_path / "dir"
    os.mkfifo(fifo)
    directory.mkdir()
    setup = (
        "from pathlib import Path\nfrom dra.fakegpus.library import FakeGpuLibrary\n"
        "from dra.gpu.library import GpuLibraryError\nfrom dra.fakegpus.profiles import load_profile"
    )
    code, output = bounded(
        f"""
        events, control = Path({str(fifo)!r}), Path({str(directory)!r})
        lib = FakeGpuLibrary(load_profile("h100x8"), "n", events, processes=control)
        lib.init()
        assert lib.wait_xid_event(100) is None
        try:
            lib.processes.current()
        except GpuLibraryError as err:
            sys.exit(str(err))
        """,
        setup,
    )
    assert (code, output) == (
        1,
        f"fake GPU processes: control file: {directory} is a directory, not a regular file",
    )


def test_a_subdirectory_of_config_dir_is_named_not_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    line = one_line_error(["device-plugin", "--check-config", "--config-dir", str(tmp_path)])
    assert line == f"dra-gpu: error: config sub: {tmp_path / 'sub'} is a directory, not a regular file"


def test_a_file_that_cannot_be_read_is_named_by_its_path_never_a_descriptor(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    line = one_line_error(["device-plugin", "--check-config", "--config-file", str(missing)])
    assert line == f"dra-gpu: error: --config-file: cannot read {missing}: No such file or directory"


# -- flags whose values become API objects, or name GPUs (issue 46) -------------------------

SUBDOMAIN = (
    "a DNS subdomain (lowercase letters, digits, '-' and '.', each part starting and ending with a "
    "letter or digit) of at most 253 characters"
)


@pytest.mark.parametrize("name", ["../../x y", "x" * 100_000, "Node-A", "node-a.", "node-a\n"])
def test_a_node_name_is_checked_as_the_api_server_checks_it(name: str) -> None:
    for command in ("discover", "explain", "time-slices", "kubelet-plugin", "device-plugin", "node-labeller"):
        line = one_line_error([command, "--fake-gpus", "h100x8", "--node-name", name])
        assert line.endswith(f"argument --node-name: {quote(name)} is not a node name: {SUBDOMAIN}")


def test_a_node_name_from_the_environment_is_checked_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRA_GPU_NODE_NAME", "../x")
    line = one_line_error(["discover", "--fake-gpus", "h100x8"])
    variable = "environment variable DRA_GPU_NODE_NAME='../x'"
    assert line == f"dra-gpu: error: {variable}: '../x' is not a node name: {SUBDOMAIN}"


def test_the_longest_node_name_gives_valid_slice_names(capsys: pytest.CaptureFixture[str]) -> None:
    from dra import cli
    from dra.core.labels import is_dns_subdomain

    name = ".".join(["n" * 63] * 4)[:253]
    assert cli.main(["discover", "--fake-gpus", "h100x8", "--node-name", name, "--output", "json"]) == 0
    [item] = json.loads(capsys.readouterr().out)["items"]
    assert is_dns_subdomain(item["metadata"]["name"])
    assert item["spec"]["nodeName"] == item["spec"]["pool"]["name"] == name


@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        ("static,GPU-xyz=dynamic", "'GPU-xyz=dynamic': name a node"),
        (
            "static," + "9" * 5000 + "=dynamic",
            "'99999999999999999999999999999999999999999999999999999999...: name a node",
        ),
        (
            "static,1024=dynamic",
            "'1024=dynamic': name a node (@node-a=dynamic), a GPU by index from 0 to 1023",
        ),
        ("static,²=dynamic", "'²=dynamic': name a node"),
        ("static,0=dynamic,0=whole", "'0=whole': GPU 0 has a mode already; give each GPU one"),
    ],
)
def test_mig_mode_names_gpus_by_index_or_uuid_only(value: str, complaint: str) -> None:
    for command in ("discover", "explain", "kubelet-plugin"):
        line = one_line_error([command, "--fake-gpus", "h100x8", "--mig-mode", value])
        assert f"argument --mig-mode: {complaint}" in line, line


@pytest.mark.parametrize("value", ["1" * 5000, "²", "1024"])
def test_gpu_selectors_name_gpus_by_index_below_the_most_a_node_has(value: str) -> None:
    line = one_line_error(["kubelet-plugin", "--fake-gpus", "h100x8", "--dra-gpus", value])
    assert "is not a GPU index (0 to 1023), a GPU-/MIG- UUID or model=<product name>" in line
    assert len(line) < 300


def test_mig_mode_overrides_of_gpus_the_node_lacks_are_named(capsys: pytest.CaptureFixture[str]) -> None:
    from dra import cli

    other = "GPU-00000000-0000-0000-0000-000000000000"
    assert (
        cli.main(["discover", "--fake-gpus", "h100x8", "--mig-mode", f"static,99=dynamic,{other}=whole"]) == 0
    )
    [warning] = [line for line in capsys.readouterr().err.splitlines() if "WARNING" in line]
    assert warning.endswith(
        f"--mig-mode: no GPU of this node matches 99=dynamic, {other}=whole "
        "(it has GPUs 0, 1, 2, 3, 4, 5, 6, 7 and their UUIDs); ignored here"
    )


@pytest.mark.parametrize("value", ["-1", "33", "38", "9" * 5000, "1.34"])
def test_kubernetes_minor_is_a_supported_release(value: str) -> None:
    line = one_line_error(["discover", "--fake-gpus", "h100x8", "--kubernetes-minor", value])
    assert (
        "argument --kubernetes-minor: expected a minor release from 34 to 37 (Kubernetes 1.34 to 1.37)"
        in line
    )


def test_an_instance_id_needs_a_rolling_update() -> None:
    line = one_line_error(
        ["kubelet-plugin", "--node-name", "n", "--instance-id", "x", "--rolling-update", "false"]
    )
    assert line == (
        "dra-gpu: error: --instance-id needs --rolling-update: "
        "it names the sockets of an instance in a rolling update"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--mig-config", "all-1g"],
            "--mig-config needs --mig-config-file: it names one of that file's layouts",
        ),
        (
            ["--fake-gpu-root", "/tmp"],
            "--fake-gpu-root needs --fake-gpus: it holds the fake GPUs' device nodes and driver",
        ),
    ],
)
def test_options_that_need_another_are_refused_by_every_command_alike(argv: list[str], message: str) -> None:
    commands = (
        ["discover", "kubelet-plugin"]
        if "--mig-config" in argv
        else ["discover", "explain", "time-slices", "kubelet-plugin", "device-plugin"]
    )
    for command in commands:
        assert one_line_error([command, "--node-name", "n", *argv]) == f"dra-gpu: error: {message}", command


def test_fake_gpu_root_and_events_are_checked_for_what_they_are(tmp_path: Path) -> None:
    for command in ("discover", "explain", "kubelet-plugin"):
        line = one_line_error([command, "--fake-gpus", "h100x8", "--fake-gpu-root", "/etc/passwd"])
        assert line.endswith(
            "argument --fake-gpu-root: /etc/passwd is not a directory (give one, or a path to make one at)"
        )
    line = one_line_error(["kubelet-plugin", "--fake-gpus", "h100x8", "--fake-gpu-events", str(tmp_path)])
    assert line.endswith(
        f"argument --fake-gpu-events: {tmp_path} is not a regular file (give a file, or a path for one)"
    )


# -- upper bounds --------------------------------------------------------------------------


@pytest.mark.parametrize("replicas", [1_000_000, 1_000_000_000])
def test_replicas_have_an_upper_bound(tmp_path: Path, replicas: int) -> None:
    config = _file(
        tmp_path,
        "config.yaml",
        "version: v1\nsharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: "
        + f"{replicas}}}]}}}}",
    )
    line = one_line_error(
        ["device-plugin", f"--config-file={config}", "--check-config", "--fake-gpus=h100x8"]
    )
    assert line.endswith(f"sharing.timeSlicing.resources[0].replicas: at most 1000, got {replicas}")


def test_a_fake_profile_cannot_ask_for_a_hundred_million_gpus(tmp_path: Path) -> None:
    profile = _file(tmp_path, "p.yaml", "gpus: [{model: t4, count: 100000000}]")
    assert "gpus[0].count: at most 1024, got 100000000" in one_line_error(
        ["device-plugin", "--check-config", f"--fake-gpus={profile}"]
    )


@pytest.mark.parametrize("version", ["1².4", "12.⁴", "1" * 5000 + ".4"])
def test_profile_numbers_are_ascii_digits_int_takes(tmp_path: Path, version: str) -> None:
    profile = _file(tmp_path, "p.yaml", json.dumps({"cudaDriverVersion": version, "gpus": [{"model": "t4"}]}))
    assert "cudaDriverVersion must look like 12.4" in one_line_error(
        ["device-plugin", "--check-config", f"--fake-gpus={profile}"]
    )


@pytest.mark.parametrize(
    ("gpu", "complaint"),
    [
        (
            {"model": "t4", "pcieRoot": [1, 2]},
            "gpus[0].pcieRoot: expected a string, got [1, 2]",
        ),
        (
            {"model": "t4", "pcieRoot": "pci0000:zz"},
            "gpus[0].pcieRoot: expected a root complex as sysfs names it, pci<domain>:<bus> in lower-case "
            "hexadecimal such as pci0000:80, got 'pci0000:zz'",
        ),
        ({"productName": ["x"], "memoryMiB": 1024}, "gpus[0].productName: expected a string, got ['x']"),
    ],
)
def test_profile_strings_are_strings_of_their_form(
    tmp_path: Path, gpu: dict[str, Any], complaint: str
) -> None:
    # Published as given, pcieRoot: [1, 2] was the attribute string "[1, 2]".
    profile = _file(tmp_path, "p.yaml", json.dumps({"gpus": [gpu]}))
    line = one_line_error(["discover", "--fake-gpus", profile, "--node-name", "n"])
    assert line.endswith(complaint), line


def test_a_mig_layout_is_named_by_a_string(tmp_path: Path) -> None:
    layouts = _file(
        tmp_path, "l.yaml", "version: v1\nmig-configs:\n  5: [{devices: all, mig-enabled: false}]\n"
    )
    line = one_line_error(
        ["discover", "--fake-gpus", "h100x8", "--mig-config-file", layouts, "--mig-config", "5"]
    )
    assert line == f"dra-gpu: error: {layouts}: mig-configs: a layout's name is a string, got 5 (quote it)"


def _layout(entries: list[dict[str, Any]]) -> str:
    return json.dumps({"version": "v1", "mig-configs": {"big": entries}})


def test_mig_layouts_are_bounded_and_checked_for_overlaps_in_linear_time(tmp_path: Path) -> None:
    setup = "from dra.core.migconfig import MigConfigError, parse_mig_configs\nimport json"
    twenty_thousand = [{"devices": [i % 1000], "mig-enabled": False} for i in range(20_000)]
    output = refusal(
        f"parse_mig_configs(json.loads({_layout(twenty_thousand)!r}), 'f')", setup, "MigConfigError"
    )
    assert "mig-configs.big: expected a list of 1 to 1024 entries" in output
    # The most entries allowed, each with the most filters, all disjoint but the last: quick.
    filters = [[f"0x{(i * 64 + j):08X}" for j in range(64)] for i in range(1024)]
    entries = [{"devices": "all", "device-filter": f, "mig-enabled": False} for f in filters]
    entries[-1]["device-filter"] = filters[3][-1]
    output = refusal(f"parse_mig_configs(json.loads({_layout(entries)!r}), 'f')", setup, "MigConfigError")
    assert "mig-configs.big[1023]: selects GPUs that f: mig-configs.big[3] selects too" in output


# -- explain: wrong types are field errors ------------------------------------------------

_CLAIM: dict[str, Any] = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaim",
    "metadata": {"name": "c", "namespace": "ns", "uid": "u"},
    "spec": {
        "devices": {
            "requests": [
                {
                    "name": "a",
                    "exactly": {"deviceClassName": DRIVER, "count": 1, "allocationMode": "ExactCount"},
                },
                {
                    "name": "b",
                    "firstAvailable": [
                        {
                            "name": "s",
                            "deviceClassName": DRIVER,
                            "selectors": [{"cel": {"expression": "true"}}],
                        }
                    ],
                },
            ],
            "constraints": [{"requests": ["a"], "matchAttribute": f"{DRIVER}/uuid"}],
        }
    },
}
_CLASS: dict[str, Any] = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "k"},
    "spec": {"selectors": [{"cel": {"expression": "true"}}]},
}


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [path] if path else []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else []
    for key, item in items:
        found += _paths(item, (*path, key))
    return found


def _replaced(doc: Any, path: tuple[Any, ...], new: Any) -> Any:
    copy = json.loads(json.dumps(doc))
    node = copy
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = new
    return copy


def _wrong(value: Any) -> Any:
    return 7 if isinstance(value, str | dict | list) else "seven"


def test_explain_names_the_field_of_every_wrong_type(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dra import cli

    cases = [(_CLAIM, p) for p in _paths(_CLAIM) if p[0] not in ("apiVersion", "kind")]
    cases += [(_CLASS, p) for p in _paths(_CLASS) if p[0] not in ("apiVersion", "kind")]
    assert len(cases) >= 29
    for doc, path in cases:
        value: Any = doc
        for key in path:
            value = value[key]
        target = tmp_path / "input.yaml"
        target.write_text(json.dumps(_replaced(doc, path, _wrong(value))))
        flag = "--claim" if doc is _CLAIM else "--device-class"
        code = cli.main(["explain", flag, str(target), "--fake-gpus", "h100x8"])
        err = capsys.readouterr().err
        if code != 0:
            assert len(err.strip().splitlines()) == 1, (path, err)
            assert "expected" in err or "does not compile" in err or "count must be" in err, (path, err)


@pytest.mark.parametrize("kind", [{"requests": []}, ["ResourceClaim"], 7, None])
def test_explain_takes_a_kind_that_is_no_string_for_no_claim(
    kind: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A second `kind:` key holding a mapping overrides the first (found by the explain fuzz target).
    from dra import cli

    target = tmp_path / "input.yaml"
    target.write_text(json.dumps({**_CLAIM, "kind": kind}))
    code = cli.main(["explain", "--claim", str(target), "--fake-gpus", "h100x8"])
    err = capsys.readouterr().err
    assert code != 0
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err


# -- explain refuses what the API server refuses (issue 46) ----------------------------------

_REQUEST = '{"name": "a", "exactly": {"deviceClassName": "gpu.nvidia.com"EXTRA}}'


def _claim_text(devices: str, kind: str = "ResourceClaim") -> str:
    spec = f'{{"devices": {devices}}}' if kind == "ResourceClaim" else f'{{"spec": {{"devices": {devices}}}}}'
    head = f'"apiVersion": "resource.k8s.io/v1", "kind": "{kind}", "metadata": {{"name": "c"}}'
    return f'{{{head}, "spec": {spec}}}'


def _requests(extra: str = "", more: str = "") -> str:
    return '{"requests": [' + _REQUEST.replace("EXTRA", extra) + "]" + more + "}"


@pytest.mark.parametrize(
    ("devices", "complaint"),
    [
        (
            _requests(', "count": 1e30'),
            "exactly.count: expected an integer from 1 to 9223372036854775807, got '1e30'",
        ),
        (
            _requests(', "count": 1' + "0" * 30),
            "exactly.count: expected an integer from 1 to 9223372036854775807, got 1" + "0" * 30,
        ),
        (
            _requests(', "count": -2'),
            "exactly.count: expected an integer from 1 to 9223372036854775807, got -2",
        ),
        (
            _requests(', "count": 2.0'),
            "exactly.count: expected an integer from 1 to 9223372036854775807, got 2.0",
        ),
        (
            _requests(', "allocationMode": "Bogus"'),
            "exactly.allocationMode: 'Bogus' is not one of All, ExactCount",
        ),
        (
            _requests(', "allocationMode": "All", "count": 2'),
            "exactly.count: must not be given with allocationMode All, got 2",
        ),
        (
            _requests("", ', "constraints": [{"requests": ["zz"], "matchAttribute": "gpu.nvidia.com/uuid"}]'),
            "constraints[0].requests[0]: 'zz' is not a request of this claim: name a request, or a request "
            "and its subrequest joined by '/' (the claim has a)",
        ),
        (
            _requests("", ', "constraints": [{"matchAttribute": "uuid"}]'),
            "constraints[0].matchAttribute: 'uuid' is not a fully qualified attribute name",
        ),
        (
            _requests("", ', "config": [{"requests": ["b"], "opaque": {"driver": "d", "parameters": {}}}]'),
            "config[0].requests[0]: 'b' is not a request of this claim",
        ),
        (_requests().replace('"a"', '"A_b"'), "requests[0].name: 'A_b' is not a DNS label"),
        (
            '{"requests": [' + _REQUEST.replace("EXTRA", "") + ", " + _REQUEST.replace("EXTRA", "") + "]}",
            "requests[1].name: 'a' is given twice",
        ),
        (
            '{"requests": [{"name": "a"}]}',
            "requests[0]: exactly one of exactly and firstAvailable is required; neither is given",
        ),
        (
            _requests().replace("gpu.nvidia.com", "Bad_Class"),
            "exactly.deviceClassName: 'Bad_Class' is not a DeviceClass name",
        ),
        (
            _requests(', "selectors": [{"cel": {"expression": "' + "true && " * 1300 + 'true"}}]'),
            "exactly.selectors[0].cel.expression: at most 10240 bytes, has 10404",
        ),
    ],
)
@pytest.mark.parametrize("kind", ["ResourceClaim", "ResourceClaimTemplate"])
def test_explain_refuses_a_claim_the_api_server_refuses_naming_the_field(
    tmp_path: Path, devices: str, complaint: str, kind: str
) -> None:
    path = _file(tmp_path, "claim.json", _claim_text(devices, kind))
    line = one_line_error(["explain", "--fake-gpus", "h100x8", "--claim", path])
    where = "spec.devices." if kind == "ResourceClaim" else "spec.spec.devices."
    if complaint.startswith("exactly."):
        complaint = "requests[0]." + complaint
    assert line.startswith(f"dra-gpu: error: {path}: document 1 ({kind}): {where}{complaint}"), line


@pytest.mark.parametrize(
    "devices",
    [
        _requests(', "count": 0'),
        _requests(', "count": null, "allocationMode": null'),
        _requests(', "count": 9223372036854775807'),
        _requests(', "allocationMode": "All", "count": 0'),
        _requests("", ', "constraints": [{"requests": ["a"], "matchAttribute": "gpu.nvidia.com/uuid"}]'),
    ],
)
def test_explain_takes_what_the_api_server_stores(
    tmp_path: Path, devices: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # count 0 and null are defaulted to 1 by the API server; the largest int64 is stored as it is.
    from dra import cli

    path = _file(tmp_path, "claim.json", _claim_text(devices))
    assert cli.main(["explain", "--fake-gpus", "h100x8", "--claim", path]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("spec", ["null", '{"devices": null}', '{"devices": {"requests": []}}'])
def test_a_claim_without_requests_is_explained_as_one_that_gets_no_device(
    tmp_path: Path, spec: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # The API server stores such a claim (spec is optional, requests too): explain says what it gets.
    from dra import cli

    text = _claim_text("null").replace('{"devices": null}', spec)
    path = _file(tmp_path, "claim.json", text)
    assert cli.main(["explain", "--fake-gpus", "h100x8", "--claim", path]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "claim -/c",
        "  note: the claim requests no device (spec.devices.requests is empty): it is allocated with none",
    ]


# -- the webhook and prepare ----------------------------------------------------------------


def _review(request: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "1", **request},
    }


def test_a_review_whose_kind_is_not_an_object_is_a_review_error() -> None:
    for kind in ("ResourceClaim", 7, ["x"], {"kind": 7}):
        with pytest.raises(admission.ReviewError, match=r"request\.kind: expected an object"):
            admission.review(_review({"kind": kind, "object": {}}), DRIVER)


def _claim_with(parameters_json: str) -> str:
    """A review body of a claim with these opaque parameters, spliced in as text (they need not parse)."""
    config = {"opaque": {"driver": DRIVER, "parameters": "PARAMETERS"}}
    claim = {"spec": {"devices": {"config": [config]}}}
    body = json.dumps(_review({"kind": {"kind": "ResourceClaim"}, "operation": "CREATE", "object": claim}))
    return body.replace('"PARAMETERS"', parameters_json)


def test_a_4301_digit_number_in_an_opaque_config_is_a_field_error() -> None:
    digits = "9" * 4301
    parameters = (
        '{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": '
        '{"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": ' + digits + "}}}"
    )
    _, verdict = admission.review(documents.load_json(_claim_with(parameters), "body"), DRIVER)
    [problem] = verdict.problems
    assert problem.startswith(
        "spec.devices.config[0].opaque.parameters.sharing.mpsConfig.defaultActiveThreadPercentage: "
    )
    assert len(problem) < 300
    # Prepare decodes the same parameters (the claim read from the API server) the same way.
    loaded = json.loads(parameters, parse_int=documents.bounded_int)
    with pytest.raises(coreconfig.ConfigError, match="defaultActiveThreadPercentage: expected an integer"):
        coreconfig.decode(loaded)


_MPS = '{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "MPS", '


@pytest.mark.parametrize(
    ("parameters", "complaint"),
    [
        (
            '{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "kind": "MigDeviceConfig"}',
            "parameters.kind: given more than once; give each once",
        ),
        (
            _MPS + '"strategy": "TimeSlicing"}}',
            "parameters.sharing.strategy: given more than once; give each once",
        ),
        (
            _MPS + '"mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"0": "1Gi", "0": "2Gi"}}}}',
            "parameters.sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[0]: given more than once; "
            "give each once",
        ),
        (
            _MPS + '"mpsConfig": {"defaultPinnedDeviceMemoryLimit": 1e308}}}',
            "parameters.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: 1e+308 is outside 1Mi to "
            "9223372036854775807",
        ),
        (
            _MPS + '"mpsConfig": {"defaultPinnedDeviceMemoryLimit": "1Ki"}}}',
            'parameters.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: "1Ki" is outside 1Mi to '
            "9223372036854775807",
        ),
        (
            _MPS + '"mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"0": 10000000000000000000}}}}',
            "parameters.sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[0]: 10000000000000000000 is "
            "outside 1Mi to 9223372036854775807",
        ),
    ],
)
def test_the_webhook_and_prepare_refuse_duplicate_keys_and_quantities_no_device_has(
    parameters: str, complaint: str
) -> None:
    # The API server stores opaque parameters as they were sent, duplicate keys and all (even with
    # fieldValidation=Strict): the webhook sees them in the review, prepare in the claim it reads.
    _, verdict = admission.review(documents.load_json(_claim_with(parameters), "body"), DRIVER)
    assert verdict.problems == (f"spec.devices.config[0].opaque.{complaint}",)
    claim = _claim_with(parameters)
    read = kube._decode("GET claim", 200, claim.encode())["request"]["object"]
    config = read["spec"]["devices"]["config"][0]["opaque"]["parameters"]
    with pytest.raises(coreconfig.ConfigError) as raised:
        coreconfig.decode(config)
    assert str(raised.value) == complaint.replace("parameters", coreconfig.root(config), 1)


def test_duplicate_keys_in_yaml_parameters_are_refused_as_in_json() -> None:
    text = "apiVersion: resource.nvidia.com/v1beta1\nkind: GpuConfig\n"
    text += "sharing: {strategy: MPS, 'strategy': MPS}\n"
    loaded = documents.load_yaml(text, "x")
    assert isinstance(loaded, dict)
    with pytest.raises(coreconfig.ConfigError, match=r"^GpuConfig.sharing.strategy: given more than once"):
        coreconfig.decode(loaded)
    # A key a YAML merge brings in may be given again: that is no duplicate.
    merged = documents.load_yaml("base: &b {strategy: MPS}\nsharing: {<<: *b, strategy: TimeSlicing}\n", "x")
    assert isinstance(merged, dict)
    assert not getattr(merged["sharing"], "duplicates", ())


def test_deep_opaque_parameters_are_a_field_error() -> None:
    deep = "[" * 500 + "]" * 500
    loaded = json.loads(
        '{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "x": ' + deep + "}"
    )
    with pytest.raises(coreconfig.ConfigError, match="nested deeper than 32 levels"):
        coreconfig.decode(loaded)


def test_a_deep_body_is_a_document_error_not_a_recursion_error() -> None:
    output = refusal(
        f"documents.load_json({DEEP_JSON!r}, 'the request body')",
        "from dra import documents",
        "documents.DocumentError",
    )
    assert output == "the request body: nested deeper than 100 levels"


# -- the node -------------------------------------------------------------------------------


def test_a_driver_name_that_is_a_path_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    line = one_line_error(
        [
            "kubelet-plugin",
            "--driver-name",
            "../../x",
            "--fake-gpus",
            "h100x8",
            "--node-name",
            "n",
            "--kubelet-root",
            str(tmp_path / "kubelet"),
        ]
    )
    assert "'../../x' is not a DRA driver name" in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e400", "-1"])
def test_durations_are_finite_and_not_negative(value: str) -> None:
    line = one_line_error(["kubelet-plugin", "--health-recovery-period", value, "--fake-gpus", "h100x8"])
    assert "--health-recovery-period" in line


def test_directories_locks_and_sockets_do_not_follow_the_umask(tmp_path: Path) -> None:
    import socket
    import stat

    old = os.umask(0)
    try:
        ensure_dir(tmp_path / "a/b")
        with open_lock(tmp_path / "c/lock"):
            pass
        path = tmp_path / "s.sock"
        with socket.socket(socket.AF_UNIX) as server:
            server.bind(str(path))
            owner_only(path)
    finally:
        os.umask(old)

    def mode(p: Path) -> int:
        return stat.S_IMODE(p.stat().st_mode)

    assert (mode(tmp_path / "a"), mode(tmp_path / "a/b"), mode(tmp_path / "c")) == (0o755, 0o755, 0o755)
    assert (mode(tmp_path / "c/lock"), mode(path)) == (0o600, 0o600)


# -- the kubelet plugin's own files at start (issue 55) -------------------------------------

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
"""
_SNAPSHOT = (
    '{"checksum":"sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a",'
    '"claims":{},"kind":"DraGpuCheckpoint","version":1}\n'
)


def _write(text: str) -> Any:
    return lambda path: path.write_text(text)


def _sparse(path: Path, size: int) -> None:
    path.write_bytes(b"")
    os.truncate(path, size)


def _link(target: str) -> Any:
    return lambda path: path.symlink_to(target)


#: What a disk fault or a bad restore leaves, by file: how it is made, and what the one line says.
_DAMAGED: dict[str, tuple[str, Any, str]] = {
    "deep-checkpoint": (
        "checkpoint.json",
        _write("[" * 100_000 + "]" * 100_000),
        "checkpoint {path} is nested deeper than 100 levels; the driver will not start",
    ),
    "deep-appended-change": (
        "checkpoint.json",
        _write(_SNAPSHOT + "[" * 100_000 + "\n"),
        "checkpoint {path} is nested deeper than 100 levels",
    ),
    "checkpoint-to-dev-zero": (
        "checkpoint.json",
        _link("/dev/zero"),
        "checkpoint: {path} is a character device, not a regular file; the driver will not start",
    ),
    "checkpoint-fifo": ("checkpoint.json", os.mkfifo, "checkpoint: {path} is a FIFO, not a regular file"),
    "checkpoint-directory": ("checkpoint.json", os.mkdir, "checkpoint: {path} is a directory"),
    # Sparse: 17 MiB in this process would be every later child's peak RSS too (fork copies it).
    "checkpoint-17-mib": (
        "checkpoint.json",
        lambda path: _sparse(path, 17 * 2**20),
        "checkpoint: {path} is larger than 16777216 bytes",
    ),
    "checkpoint-truncated": (
        "checkpoint.json",
        _write('{"kind": "DraGpuCh'),
        "checkpoint {path} is not valid JSON",
    ),
    "checkpoint-empty": ("checkpoint.json", _write(""), "checkpoint {path} is not valid JSON"),
    "checkpoint-wrong-shape": (
        "checkpoint.json",
        _write("[]"),
        "checkpoint {path} is not a DraGpuCheckpoint file",
    ),
    "record-to-dev-zero": (
        "gpu-assignment.json",
        _link("/dev/zero"),
        "GPU assignment record: {path} is a character device, not a regular file; move it away",
    ),
    "record-fifo": ("gpu-assignment.json", os.mkfifo, "GPU assignment record: {path} is a FIFO"),
    "checkpoint-lock-directory": (
        "checkpoint.lock",
        os.mkdir,
        "lock {path} is a directory, not a regular file; move it away",
    ),
    "checkpoint-lock-fifo": ("checkpoint.lock", os.mkfifo, "lock {path} is a FIFO"),
    "record-lock-directory": ("gpu-assignment.lock", os.mkdir, "lock {path} is a directory"),
    "publisher-lock-directory": (
        "publisher.lock",
        os.mkdir,
        "cannot take the turn to publish: lock {path} is a directory",
    ),
}


def _signature(path: Path) -> tuple[object, ...]:
    st = path.lstat()
    # The bytes of what is small; a large file's time, inode and size say whether it was written.
    readable = path.is_file() and not path.is_symlink() and st.st_size <= 2**20
    data = path.read_bytes() if readable else b""
    return (st.st_mode, st.st_ino, st.st_size, st.st_mtime_ns, data)


def _start(tmp_path: Path, state: Path) -> str:
    """The error line the kubelet plugin exits with (non-zero, under the limits), started on fake GPUs
    with `state` and an API server that does not answer; the lines logged before it are its start."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    argv = ["kubelet-plugin", "--fake-gpus", "h100x8", "--node-name", "node-a", "--kubeconfig"]
    argv += [str(kubeconfig), "--state-dir", str(state), "--cdi-root", str(tmp_path / "cdi")]
    # Short: the plugin's sockets go under the kubelet root, and a unix socket's path is 107 bytes at most.
    kubelet = Path(tempfile.mkdtemp(prefix="kubelet-", dir="/tmp"))
    argv += ["--kubelet-root", str(kubelet), "--http-address", ""]
    # The start before the files are read (fake GPUs, the assignment, sockets) takes a second of a busy
    # machine, and its threads reserve stacks of address space; the readers' own share is held to
    # the limits below.
    try:
        code, output = bounded(f"sys.exit(cli.main({argv!r}))", COMMANDS, 4 * LIMIT_SECONDS, 2**30)
    finally:
        shutil.rmtree(kubelet)
    assert code != 0
    line = output.splitlines()[-1]
    assert line.startswith("dra-gpu"), output
    assert len(line) < 600, line
    return line


@pytest.mark.parametrize("case", list(_DAMAGED))
def test_a_damaged_state_file_is_one_line_naming_it_and_is_left_as_it_was(tmp_path: Path, case: str) -> None:
    name, damage, complaint = _DAMAGED[case]
    state = tmp_path / "state"
    state.mkdir()
    path = state / name
    damage(path)
    before = _signature(path)
    line = _start(tmp_path, state)
    assert complaint.format(path=path) in line, line
    assert _signature(path) == before
    if name == "checkpoint.json":
        read = refusal(
            f"CheckpointStore(Path({str(path)!r})).load_state()",
            "from pathlib import Path\nfrom dra.adapters.checkpoint import CheckpointError, CheckpointStore",
            "CheckpointError",
        )
        assert complaint.format(path=path) in read
        assert _signature(path) == before


def test_a_state_dir_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.write_text("x")
    line = _start(tmp_path, state)
    assert line.endswith(
        f"argument --state-dir: {state} is not a directory (give one, or a path to make one at)"
    )
    assert state.read_text() == "x"


def test_an_unreadable_record_is_rewritten_with_a_warning(tmp_path: Path) -> None:
    # Documented (docs/operations.md): the record is the running paths' to rewrite; a regular file
    # that does not parse is no reason to keep a node's GPUs unpublished.
    from dra.adapters.assignmentrecord import AssignmentRecord
    from dra.core.assignment import GpuPath

    record = AssignmentRecord(tmp_path)
    record.path.write_text("[" * 100_000 + "]" * 100_000)
    record.lease(GpuPath.DRA, [], "node-a").release()
    assert record.read() == {}


def _mig_state_of_no_shape() -> str:
    # The fake GPUs' own file for the profile (the fuzz seed), its instances replaced by what is none.
    seed = Path(__file__).parents[1] / "fuzz/corpus/statefiles/fake-mig-state.json"
    state = json.loads(seed.read_text())
    state["gpus"]["0"] = [{"x": 1}]
    return json.dumps(state)


@pytest.mark.parametrize(
    ("name", "damage", "complaint"),
    [
        ("fake-gpu-mig.json", os.mkfifo, "is a FIFO, not a regular file; move it away"),
        ("fake-gpu-mig.json", _link("/dev/zero"), "is a character device"),
        ("fake-gpu-mig.json", _write("[" * 100_000 + "]" * 100_000), "nested deeper than 100 levels"),
        ("fake-gpu-mig.json", lambda path: path.write_text(_mig_state_of_no_shape()), "is not one"),
        ("fake-gpu-state.json", os.mkfifo, "is a FIFO"),
        ("fake-gpu-state.json", _write('{"GPU-1": 7}'), "is not one; move it away"),
    ],
)
def test_the_fake_gpus_state_files_are_refused_by_the_library_naming_them(
    tmp_path: Path, name: str, damage: Any, complaint: str
) -> None:
    # As NVML failing on a GPU: discovery skips the GPU with the library's message as a warning.
    damage(tmp_path / name)
    setup = (
        "from pathlib import Path\nfrom dra.fakegpus import node\nfrom dra.gpu.library import GpuLibraryError"
    )
    code, output = bounded(
        f"""
        lib = node.fake_gpu_library("a100x4-mig", "node-a", state_dir=Path({str(tmp_path)!r}))
        lib.init()
        try:
            gpu = lib.device_by_index(0)
            lib.max_mig_device_count(gpu)
            lib.time_slice(gpu)
        except GpuLibraryError as err:
            sys.exit(str(err))
        """,
        setup,
    )
    assert code == 1
    assert str(tmp_path / name) in output
    assert complaint in output, output


def test_a_fifo_in_the_cdi_folder_is_replaced_not_read(tmp_path: Path) -> None:
    from dra.adapters.nodefiles import holds

    fifo = tmp_path / "spec.json"
    os.mkfifo(fifo)
    assert not holds(fifo, b"{}")
    assert not holds(Path("/dev/zero"), b"\0" * 4)
    (tmp_path / "same").write_bytes(b"{}")
    assert holds(tmp_path / "same", b"{}")
    assert not holds(tmp_path / "same", b"{")


def _deepest(text: str) -> int:
    """The depth of JSON text by a plain walk over its characters: the reference for the fast one."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (char == "\\", char != '"')
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def test_json_depth_is_told_from_the_text_as_a_walk_over_it_tells_it() -> None:
    import random

    from dra.api.fields import json_text_deeper_than

    rng = random.Random(55)

    def value(levels: int) -> Any:
        if levels == 0 or rng.random() < 0.3:
            return rng.choice([1, 'x[{"', "]\\", [], {}, "é]"])
        if rng.random() < 0.5:
            return [value(levels - 1) for _ in range(rng.randint(0, 3))]
        return {f"k{i}[": value(levels - 1) for i in range(rng.randint(0, 3))}

    for _ in range(2000):
        text = json.dumps(value(rng.randint(0, 30)), ensure_ascii=rng.random() < 0.5)
        depth = _deepest(text)
        for limit in range(max(0, depth - 10), depth + 2):
            # Exact where it says deeper; within 8 levels where it does not.
            assert json_text_deeper_than(text, limit) == (depth > limit) or 0 < depth - limit <= 8


@pytest.mark.parametrize(
    ("unit", "times"),
    [
        ("[]", 8_000_000),
        ("[[]]", 4_000_000),
        ("[" * 9 + "]" * 9, 888_000),
        ("[" * 100 + "]" * 100, 80_000),
        ('\\"', 5_000_000),
        ("[", 16_000_000),
    ],
    ids=["pairs", "nested-pairs", "depth-9", "depth-100", "escapes", "brackets"],
)
def test_json_depth_of_16_mib_is_told_within_the_limits(unit: str, times: int) -> None:
    # The text is made in the child: 16 MB here would be every later child's peak RSS too.
    code, output = bounded(
        f"print(json_text_deeper_than({unit!r} * {times}, 100))",
        "from dra.api.fields import json_text_deeper_than",
    )
    assert code == 0, output


# -- explain as strict as kubectl; documents too wide (issue 55) -----------------------------


@pytest.mark.parametrize(
    ("kind", "devices", "top", "field"),
    [
        ("ResourceClaim", _requests(), ', "bogus": 1', "bogus"),
        ("ResourceClaim", _requests("", ', "bogus": 1'), "", "spec.devices.bogus"),
        ("ResourceClaim", _requests(', "bogus": 1'), "", "spec.devices.requests[0].exactly.bogus"),
        (
            "ResourceClaim",
            '{"requests": [{"name": "a", "firstAvailable": [{"name": "b", "deviceClassName": "c", '
            '"adminAccess": true}]}]}',
            "",
            "spec.devices.requests[0].firstAvailable[0].adminAccess",
        ),
        (
            "ResourceClaim",
            _requests(', "tolerations": [{"key": "k", "operater": "Exists"}]'),
            "",
            "spec.devices.requests[0].exactly.tolerations[0].operater",
        ),
        ("ResourceClaimTemplate", _requests("", ', "bogus": 1'), "", "spec.spec.devices.bogus"),
    ],
)
def test_explain_refuses_an_unknown_field_naming_it_as_kubectl_does(
    tmp_path: Path, kind: str, devices: str, top: str, field: str
) -> None:
    text = _claim_text(devices, kind)
    path = _file(tmp_path, "claim.json", text[:-1] + top + "}")
    line = one_line_error(["explain", "--fake-gpus", "h100x8", "--claim", path])
    assert line == f'dra-gpu: error: {path}: document 1 ({kind}): unknown field "{field}"'


def test_explain_refuses_an_unknown_field_of_a_device_class(tmp_path: Path) -> None:
    device_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "x"},
        "spec": {"selectors": [{"cel": {"expression": "true"}, "bogus": 1}]},
    }
    path = _file(tmp_path, "class.json", json.dumps(device_class))
    line = one_line_error(["explain", "--fake-gpus", "h100x8", "--device-class", path])
    assert line.endswith('(DeviceClass): unknown field "spec.selectors[0].bogus"'), line


def test_explain_takes_every_field_the_api_has(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dra import cli

    exact = (
        ', "count": 1, "adminAccess": false, "allocationMode": "ExactCount", "capacity": {"requests": '
        '{"memory": "1Gi"}}, "tolerations": [{"key": "k", "operator": "Equal", "value": "v", "effect": '
        '"NoSchedule", "tolerationSeconds": 5}], "selectors": [{"cel": {"expression": "true"}}]'
    )
    more = (
        ', "constraints": [{"requests": ["a"], "matchAttribute": "gpu.nvidia.com/uuid"}], "config": '
        '[{"requests": ["a"], "opaque": {"driver": "gpu.nvidia.com", "parameters": {"any": [1]}}}]'
    )
    claim = json.loads(_claim_text(_requests(exact, more)))
    claim["metadata"].update(
        namespace="ns",
        uid="u",
        labels={"a": "b"},
        annotations={"c": "d"},
        ownerReferences=[{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u2", "controller": True}],
        finalizers=["f"],
        creationTimestamp="2026-01-01T00:00:00Z",
        resourceVersion="1",
        generation=1,
        managedFields=[{"manager": "kubectl", "operation": "Update", "fieldsV1": {"f:spec": {}}}],
    )
    claim["status"] = {"allocation": None, "reservedFor": [], "devices": []}
    path = _file(tmp_path, "claim.json", json.dumps(claim))
    assert cli.main(["explain", "--fake-gpus", "h100x8", "--claim", path]) == 0, capsys.readouterr().err


WIDE = "\n".join(f"k{i}: 1" for i in range(100_000))


def test_a_document_of_100000_plain_keys_is_refused_as_that_and_fast(tmp_path: Path) -> None:
    path = _file(tmp_path, "wide.yaml", WIDE)
    for what, argv in _loaders(path).items():
        line = one_line_error(argv)
        assert "holds more than 100000 values (keys, items and scalars)" in line, (what, line)
        assert "aliases" not in line, (what, line)


def test_a_product_name_longer_than_the_attribute_is_refused(tmp_path: Path) -> None:
    profile = _file(tmp_path, "profile.yaml", f"gpus:\n- productName: {'x' * 100_000}\n  memoryMiB: 1024\n")
    line = one_line_error(["discover", "--fake-gpus", profile, "--node-name", "n"])
    assert "gpus[0].productName: at most 64 characters (a device attribute's string), has 100000" in line
