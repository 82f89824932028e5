"""Bounded reading of YAML and JSON documents from files and request bodies.

Every decoder of outside input (config files, MIG layouts, fake profiles, explain's
manifests, webhook bodies, the daemons' state files) reads through here, so each has the
same limits: a size cap, a nesting depth (JSON's measured on its text, YAML's on
libyaml's events, before either decoder recurses), a cap on the nodes a YAML document
holds as written and through its aliases, and integers no longer than Python converts.
A document past a limit is a DocumentError with one short line; nothing here recurses
without a bound or allocates past the size cap. An object that gives a key twice keeps
the last value, as Kubernetes' decoders do, and is marked (dra.api.fields.DuplicatedKeys)
for the configuration API, which refuses it.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, cast

import yaml

from dra.api.fields import DuplicatedKeys, json_text_deeper_than, nesting_depth, object_pairs
from dra.model.quoting import quote

#: Config files, layouts and profiles are a few KB; a MiB leaves room and bounds the memory used.
MAX_FILE_BYTES = 2**20
_CHUNK = 2**20
#: Deeper than any Kubernetes object or config file needs; well below Python's recursion limit.
MAX_DEPTH = 100
#: Scalars, sequences and mappings a YAML document may hold once its aliases are expanded.
MAX_NODES = 100_000
#: Python refuses to convert longer integers (sys.get_int_max_str_digits); JSON and YAML allow them.
MAX_INT_DIGITS = 4300
_MERGE = "tag:yaml.org,2002:merge"


class DocumentError(ValueError):
    """A document cannot be read within the limits; the message is one line naming its source."""


class MissingFileError(DocumentError):
    """The file to read does not exist: for the readers of state files, which start without one."""


class NotRegularFileError(DocumentError):
    """The path is no regular file (a directory, a FIFO, a device): refused without reading it."""


#: What a path that is not a regular file is, by the file type bits of its mode.
_FILE_TYPES = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def not_regular(mode: int) -> str | None:
    """What a file of this mode is when it is not a regular file ("a directory"), else None."""
    if stat.S_ISREG(mode):
        return None
    return next((what for test, what in _FILE_TYPES if test(mode)), "not a regular file")


def read_file(path: Path, source: str, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of a regular file of at most `limit` bytes; DocumentError naming `path` otherwise.

    The one way the project reads a file it is given (config files, layouts, profiles,
    manifests, kubeconfigs and the files they name, certificates and keys). The file's type is
    checked before it is opened, so a directory, a FIFO (which would block) or a device such as
    /dev/zero (which never ends) is refused unopened; it is opened without blocking and checked
    again once open, so a file swapped in between is refused too. Every message names the path.
    """
    try:
        what = not_regular(os.stat(path).st_mode)
        if what is None:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError as err:
        raise MissingFileError(f"{source}: cannot read {path}: {err.strerror}") from None
    except OSError as err:
        raise DocumentError(f"{source}: cannot read {path}: {err.strerror}") from None
    if what is not None:
        raise NotRegularFileError(f"{source}: {path} is {what}, not a regular file")
    try:
        what = not_regular(os.fstat(fd).st_mode)
        if what is not None:
            raise NotRegularFileError(f"{source}: {path} is {what}, not a regular file")
        chunks: list[bytes] = []
        size = 0
        # os.read, not a file object: its errors carry the descriptor's number where the path belongs.
        # A MiB at a time: a read allocates what it asks for, however little the file holds.
        while size <= limit and (chunk := os.read(fd, min(limit + 1 - size, _CHUNK))):
            chunks.append(chunk)
            size += len(chunk)
    except OSError as err:
        raise DocumentError(f"{source}: cannot read {path}: {err.strerror}") from None
    finally:
        os.close(fd)
    if size > limit:
        raise DocumentError(f"{source}: {path} is larger than {limit} bytes")
    return b"".join(chunks)


def read_text(path: Path, source: str, limit: int = MAX_FILE_BYTES) -> str:
    """`read_file`'s bytes as UTF-8 text; DocumentError naming the path when they are not."""
    return _text(read_file(path, source, limit), f"{source}: {path}")


def _text(data: bytes | str, source: str) -> str:
    if isinstance(data, str):
        return data
    try:
        return data.decode()
    except UnicodeDecodeError as err:
        raise DocumentError(f"{source}: not UTF-8 text (byte {err.start})") from None


class _Loader(yaml.CSafeLoader):
    """YAML's safe loader in libyaml (C), with bounded integers and duplicate keys marked.

    Given only text that _check_events passed: its composer recurses once per level.
    """

    def construct_yaml_map(self, node: Any) -> Any:
        """A mapping, a DuplicatedKeys when the document gave one of its keys twice (as JSON's objects)."""
        # Among the mapping's own keys: one that a merge (<<) brings in may be given again.
        seen: set[tuple[str, str]] = set()
        repeated: dict[str, None] = {}
        for key, _ in node.value:
            if isinstance(key, yaml.ScalarNode) and key.tag != _MERGE:
                if (key.tag, key.value) in seen:
                    repeated[str(key.value)] = None
                seen.add((key.tag, key.value))
        data: dict[Any, Any] = DuplicatedKeys({}, tuple(repeated)) if repeated else {}
        yield data
        data.update(self.construct_mapping(node))

    def construct_yaml_int(self, node: Any) -> Any:
        if len(str(node.value)) > MAX_INT_DIGITS:
            raise yaml.MarkedYAMLError(
                problem=f"an integer of more than {MAX_INT_DIGITS} digits", problem_mark=node.start_mark
            )
        return super().construct_yaml_int(node)


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)
_Loader.add_constructor("tag:yaml.org,2002:map", _Loader.construct_yaml_map)


#: The events that are a node each, and those that open and close one holding others.
_NODE_EVENTS = (yaml.ScalarEvent, yaml.AliasEvent, yaml.SequenceStartEvent, yaml.MappingStartEvent)
_OPENING = (yaml.SequenceStartEvent, yaml.MappingStartEvent)
_CLOSING = (yaml.SequenceEndEvent, yaml.MappingEndEvent)


def _check_events(text: str) -> None:
    """DocumentError when a document of the stream holds more than MAX_NODES nodes as written, or
    nests deeper than MAX_DEPTH; a YAMLError where it is no YAML.

    Told from libyaml's events, before any node is made: 100,000 keys are refused in the time
    their first 100,000 events take (PyYAML's own scanner took 8 s of CPU to read them all, and
    they were refused only then, as if aliases had made them).
    """
    parser = yaml.CSafeLoader(text)
    try:
        nodes = depth = 0
        while (event := parser.get_event()) is not None and not isinstance(event, yaml.StreamEndEvent):
            if isinstance(event, yaml.DocumentStartEvent):
                nodes = 0
            elif isinstance(event, _NODE_EVENTS):
                nodes += 1
                if nodes > MAX_NODES:
                    raise DocumentError(f"holds more than {MAX_NODES} values (keys, items and scalars)")
                if isinstance(event, _OPENING):
                    depth += 1
                    if depth > MAX_DEPTH:
                        # libyaml's marks have the line and column the message reads.
                        mark = cast(yaml.Mark, event.start_mark)
                        raise yaml.MarkedYAMLError(
                            problem=f"nested deeper than {MAX_DEPTH} levels", problem_mark=mark
                        )
            elif isinstance(event, _CLOSING):
                depth -= 1
    finally:
        parser.dispose()


def _expanded_nodes(root: yaml.Node) -> int:
    """How many nodes the document holds with every alias expanded, counted without expanding them.

    An alias inside its own anchor (`a: &a [*a]`) expands forever: counted as too many.
    """
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    # Children before parents, iteratively: the composer already bounded the depth, not the width.
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, ready = stack.pop()
        if id(node) in sizes:
            continue
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        if ready:
            open_nodes.discard(id(node))
            sizes[id(node)] = min(MAX_NODES + 1, 1 + sum(sizes[id(c)] for c in children))
            continue
        if any(id(c) in open_nodes for c in children):
            return MAX_NODES + 1
        open_nodes.add(id(node))
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in sizes)
    return sizes[id(root)]


def _yaml_error(err: yaml.YAMLError, source: str) -> DocumentError:
    # PyYAML's own message spans several lines (with a source excerpt); keep one.
    detail = " ".join(str(err).split())
    if isinstance(err, yaml.MarkedYAMLError) and err.problem_mark is not None:
        mark = err.problem_mark
        detail = f"line {mark.line + 1}, column {mark.column + 1}: {err.problem}"
    return DocumentError(f"{source}: not valid YAML or JSON: {detail}")


def load_yaml_all(data: bytes | str, source: str) -> list[object]:
    """Every document of a YAML (or JSON) stream, within the limits; DocumentError naming `source`."""
    text = _text(data, source)
    if len(text) > MAX_FILE_BYTES:
        raise DocumentError(f"{source}: larger than {MAX_FILE_BYTES} bytes")
    documents: list[object] = []
    try:
        _check_events(text)
        loader = _Loader(text)
    except yaml.YAMLError as err:
        raise _yaml_error(err, source) from None
    except DocumentError as err:
        raise DocumentError(f"{source}: {err}") from None
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is not None and _expanded_nodes(node) > MAX_NODES:
                raise DocumentError(f"expands (through aliases) to more than {MAX_NODES} values")
            documents.append(loader.construct_document(node))
    except yaml.YAMLError as err:
        raise _yaml_error(err, source) from None
    except DocumentError as err:
        raise DocumentError(f"{source}: {err}") from None
    except ValueError as err:
        # The constructors' own conversions (a timestamp out of range, say).
        raise DocumentError(f"{source}: not valid YAML: {quote(str(err))}") from None
    finally:
        loader.dispose()
    return documents


def load_yaml(data: bytes | str, source: str) -> object:
    """The one YAML (or JSON) document of `data` (None when empty), within the limits."""
    documents = load_yaml_all(data, source)
    if len(documents) > 1:
        raise DocumentError(f"{source}: expected one YAML document, found {len(documents)}")
    return documents[0] if documents else None


def bounded_int(digits: str) -> int | float:
    """json.loads' parse_int: an integer, or an infinity for one longer than Python converts.

    Every integer or quantity field refuses an infinity with its path, where a ValueError
    from int() would refuse the whole document.
    """
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        return float("-inf") if digits.startswith("-") else float("inf")
    return int(digits)


def load_json(data: bytes | str, source: str, limit: int = MAX_FILE_BYTES) -> object:
    """One JSON value, within the size and depth limits; DocumentError naming `source`.

    Integers too long to convert become infinities, so that the field holding one is
    reported by whoever checks that field rather than the whole document refused.
    """
    if len(data) > limit:
        raise DocumentError(f"{source}: larger than {limit} bytes")
    text = _text(data, source)
    if json_text_deeper_than(text, MAX_DEPTH):
        raise DocumentError(f"{source}: nested deeper than {MAX_DEPTH} levels")
    try:
        value = json.loads(text, parse_int=bounded_int, object_pairs_hook=object_pairs)
    except json.JSONDecodeError as err:
        raise DocumentError(
            f"{source}: not valid JSON: line {err.lineno}, column {err.colno}: {err.msg}"
        ) from None
    if nesting_depth(value, MAX_DEPTH) > MAX_DEPTH:
        raise DocumentError(f"{source}: nested deeper than {MAX_DEPTH} levels")
    return value
