"""Why a claim does (not) get devices: every selector of its requests evaluated on every device.

Pure: the claim (or claim template), the DeviceClasses and the node's
ResourceSlices come in as API objects, the report goes out as data. The CEL
evaluation follows the scheduler's rules (dra.cel), and the report adds what
the scheduler also weighs: how many devices a request needs, matchAttribute
constraints, devices already allocated to other claims, and shared counters
(dynamic MIG) that the devices other claims hold have used up.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from dra.cel import (
    Budget,
    BudgetSpentError,
    CelSyntaxError,
    Explanation,
    Program,
    compile_expression,
    explain_program,
)
from dra.core.deviceentries import DEPRECATED_ATTRIBUTES, DEPRECATED_ATTRIBUTES_REMOVED_IN
from dra.explain.devices import (
    Counter,
    CounterKey,
    allocated_devices,
    counter_shortage,
    counters_left,
    slice_devices,
)
from dra.explain.shapes import ExplainError, check_shape, count_of
from dra.model.quoting import quote

# What one explain run may spend, across its selectors and devices: an eighth of what the
# scheduler allows one selector on one device (CELSelectorExpressionMaxCost), which this
# evaluator spends in about half a second even on a loaded machine (docs/architecture.md).
EXPLAIN_COST_BUDGET = 125_000

Obj = Mapping[str, Any]


def standard_device_classes(driver: str) -> list[dict[str, Any]]:
    """The DeviceClasses the chart installs: full GPUs, MIG devices, GPUs passed through, of this driver."""

    def device_class(name: str, device_type: str) -> dict[str, Any]:
        expression = f'device.driver == "{driver}" && device.attributes["{driver}"].type == "{device_type}"'
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": expression}}]},
        }

    suffix = driver.split(".", 1)[1] if "." in driver else driver
    return [
        device_class(driver, "gpu"),
        device_class(f"mig.{suffix}", "mig"),
        device_class(f"vfio.{driver}", "vfio"),
    ]


@dataclass(frozen=True)
class SelectorVerdict:
    """One selector on one device."""

    source: str
    expression: str
    matched: bool
    error: str | None
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class DeviceVerdict:
    """Every selector of a request on one device."""

    driver: str
    pool: str
    device: str
    selectors: tuple[SelectorVerdict, ...]
    in_use_by: str | None = None
    #: Why the shared counters it consumes have too little left (dynamic MIG), if they do.
    short_of: str | None = None

    @property
    def matched(self) -> bool:
        """All selectors true (the scheduler also needs the device free)."""
        return all(s.matched for s in self.selectors)

    @property
    def error(self) -> str | None:
        """The first CEL runtime error; the scheduler aborts the attempt on it."""
        return next((s.error for s in self.selectors if s.error), None)


@dataclass(frozen=True)
class RequestReport:
    """One request (or one subrequest of a prioritized list) against the node's devices."""

    name: str
    device_class: str
    mode: str
    count: int
    devices: tuple[DeviceVerdict, ...]
    constraints: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()
    admin_access: bool = False
    #: Advice that does not change the verdict, such as a deprecated attribute in a selector.
    notes: tuple[str, ...] = ()

    @property
    def matching(self) -> list[str]:
        """Devices whose selectors all match."""
        return [d.device for d in self.devices if d.matched]

    @property
    def available(self) -> list[str]:
        """Matching devices that no other claim holds (admin access may use held ones too)."""
        return [
            d.device
            for d in self.devices
            if d.matched and (self.admin_access or (d.in_use_by is None and d.short_of is None))
        ]

    @property
    def errors(self) -> list[str]:
        """Runtime errors, per device."""
        return [f"{d.device}: {d.error}" for d in self.devices if d.error]

    def verdict(self) -> str:
        """One line a person can act on."""
        if self.problems:
            return "cannot be allocated: " + "; ".join(self.problems)
        if self.errors:
            return f"the scheduler stops with a CEL runtime error ({self.errors[0]})"
        needed = len(self.matching) if self.mode == "All" else self.count
        if self.mode == "All" and not self.matching:
            return "no device matches: allocationMode All needs at least one"
        if len(self.matching) < needed:
            return f"{len(self.matching)} device(s) match, {needed} needed: cannot be allocated"
        if self.mode == "All" and len(self.available) < needed:
            return f"all {needed} matching devices are needed but some are in use: waits until they are free"
        if len(self.available) < needed:
            short = next(
                (d.short_of for d in self.devices if d.matched and d.short_of and not d.in_use_by), None
            )
            why = f" ({short})" if short else ""
            free = len(self.available)
            return f"{free} matching device(s) free, {needed} needed: waits for a free device{why}"
        return f"can be allocated: {len(self.available)} free matching device(s), {needed} needed"


@dataclass(frozen=True)
class ClaimReport:
    """Every request of a claim."""

    claim: str
    requests: tuple[RequestReport, ...]
    notes: tuple[str, ...] = field(default=())


def _selectors(source: str, selectors: Sequence[Obj] | None) -> list[tuple[str, str]]:
    return [
        (f"{source} selector {i + 1}", s["cel"]["expression"])
        for i, s in enumerate(selectors or [])
        if "cel" in s
    ]


@dataclass
class _Spending:
    """One explain run's CEL budget and what each selector has spent of it."""

    budget: Budget
    by_selector: dict[str, int] = field(default_factory=dict)

    def explain(self, request: str, source: str, program: Program, device: Obj, driver: str) -> Explanation:
        before = self.budget.spent
        key = f"{source} of request {request!r}"
        try:
            return explain_program(program, device, driver, self.budget)
        except BudgetSpentError:
            raise ExplainError(self.spent_message(key, str(device.get("name")))) from None
        finally:
            self.by_selector[key] = self.by_selector.get(key, 0) + self.budget.spent - before

    def spent_message(self, key: str, device: str) -> str:
        spent = ", ".join(f"{name} {units:,}" for name, units in self.by_selector.items() if units)
        return (
            f"explain's CEL budget of {self.budget.limit:,} cost units per run is spent, by {key} "
            f"on device {device}; spent so far: {spent}"
        )


def _evaluate(
    name: str,
    spec: Obj,
    classes: Mapping[str, Obj],
    devices: Sequence[tuple[str, str, Obj]],
    held: Mapping[tuple[str, str, str], str],
    constraints: tuple[str, ...],
    left: Mapping[CounterKey, Mapping[str, Counter]],
    spending: _Spending,
) -> RequestReport:
    class_name = str(spec.get("deviceClassName", ""))
    device_class = classes.get(class_name)
    # check_shape has checked both as the API server does, and count_of defaults them as it does.
    mode = str(spec.get("allocationMode") or "ExactCount")
    count = count_of(spec, f"request {quote(name)}") or 1
    if device_class is None:
        missing = f"DeviceClass {quote(class_name)} does not exist"
        return RequestReport(name, class_name, mode, count, (), constraints, (missing,))
    selectors = _selectors(f"class {class_name}", (device_class.get("spec") or {}).get("selectors"))
    selectors += _selectors("request", spec.get("selectors"))
    programs = []
    for source, expression in selectors:
        try:
            programs.append((source, expression, compile_expression(expression)))
        except CelSyntaxError as err:
            # One line: cel-go's position, without the source line and caret under it.
            where = f"<input>:{err.line}:{err.column}"
            raise ExplainError(
                f"{source} of request {quote(name)} does not compile: {where}: {err.message}"
            ) from None
    verdicts = []
    for driver, pool, device in devices:
        results = []
        for source, expression, program in programs:
            outcome = spending.explain(name, source, program, device, driver)
            # A reason about the whole selector needs no quote of it: the report prints the selector.
            reasons = tuple(
                r.message.removeprefix("is ") if r.expression == expression else str(r)
                for r in outcome.reasons
            )
            results.append(SelectorVerdict(source, expression, outcome.matched, outcome.error, reasons))
            # Like the scheduler: class selectors first, then the request's, stopping at the first
            # that does not match, so a later selector never errors on a device already excluded.
            if not outcome.matched:
                break
        verdicts.append(
            DeviceVerdict(
                driver,
                pool,
                str(device["name"]),
                tuple(results),
                held.get((driver, pool, device["name"])),
                counter_shortage(device, driver, pool, left),
            )
        )
    admin = bool(spec.get("adminAccess"))
    drivers = {driver for driver, _, _ in devices}
    notes = _deprecated_uses(programs, constraints, drivers)
    report = RequestReport(
        name, class_name, mode, count, tuple(verdicts), constraints, admin_access=admin, notes=notes
    )
    problems = _constraint_problems(report, devices, constraints)
    if problems:
        report = replace(report, problems=tuple(problems))
    return report


def _deprecated_uses(
    programs: Sequence[tuple[str, str, Program]], constraints: tuple[str, ...], drivers: set[str]
) -> tuple[str, ...]:
    """A note for every deprecated attribute of the node's drivers that a selector or constraint reads."""
    uses = [
        (source, name)
        for source, _, program in programs
        for domain, name in sorted(program.attribute_references())
        if domain in drivers
    ]
    for constraint in constraints:
        domain, _, name = constraint.rpartition("/")
        if domain in drivers:
            uses.append(("constraint matchAttribute", name))
    return tuple(
        f"{source} reads {name!r}, deprecated: published until {DEPRECATED_ATTRIBUTES_REMOVED_IN} only and "
        f"not by NVIDIA's driver; select on {DEPRECATED_ATTRIBUTES[name]}"
        for source, name in dict.fromkeys(uses)
        if name in DEPRECATED_ATTRIBUTES
    )


def _attribute(device: Obj, qualified: str, driver: str) -> object:
    domain, _, name = qualified.rpartition("/")
    attributes = device.get("attributes") or {}
    value = attributes.get(qualified) or (attributes.get(name) if domain == driver else None)
    return next(iter(value.values())) if value else None


def _constraint_problems(
    report: RequestReport, devices: Sequence[tuple[str, str, Obj]], constraints: tuple[str, ...]
) -> list[str]:
    if not constraints or report.mode == "All":
        return []
    by_name = {d["name"]: (driver, d) for driver, _, d in devices}
    groups: dict[tuple[object, ...], int] = {}
    for name in report.available:
        driver, device = by_name[name]
        key = tuple(_attribute(device, c, driver) for c in constraints)
        if None not in key:
            groups[key] = groups.get(key, 0) + 1
    if not any(n >= report.count for n in groups.values()):
        best = max(groups.values(), default=0)
        return [
            f"at most {best} free matching device(s) share {', '.join(constraints)}; {report.count} needed"
        ]
    return []


def explain_claim(
    claim: Obj,
    classes: Iterable[Obj],
    slices: Iterable[Obj],
    other_claims: Iterable[Obj] = (),
    budget: Budget | None = None,
) -> ClaimReport:
    """Report every request of a ResourceClaim or ResourceClaimTemplate on the devices of `slices`.

    Every selector on every device spends from ``budget`` (default: a new one of
    EXPLAIN_COST_BUDGET); raises ExplainError, with what each selector spent, where it runs out.
    """
    spending = _Spending(budget or Budget(EXPLAIN_COST_BUDGET))
    check_shape(
        claim, "ResourceClaimTemplate" if claim.get("kind") == "ResourceClaimTemplate" else "ResourceClaim"
    )
    meta = claim.get("metadata") or {}
    spec = claim.get("spec") or {}
    if claim.get("kind") == "ResourceClaimTemplate":
        spec = spec.get("spec") or {}
    by_name = {c["metadata"]["name"]: c for c in classes}
    slices = list(slices)
    devices = slice_devices(slices)
    held = allocated_devices(other_claims, except_uid=meta.get("uid"))
    left = counters_left(slices, held)
    device_spec = spec.get("devices") or {}
    constraints: dict[str, list[str]] = {}
    all_requests = [r["name"] for r in device_spec.get("requests") or []]
    for constraint in device_spec.get("constraints") or []:
        # A null field is an absent one, as the API server reads it.
        if constraint.get("matchAttribute") is not None:
            for request in constraint.get("requests") or all_requests:
                constraints.setdefault(request, []).append(constraint["matchAttribute"])
    reports = []
    for request in device_spec.get("requests") or []:
        name = request["name"]
        if request.get("firstAvailable") is not None:
            for sub in request["firstAvailable"]:
                reports.append(
                    _evaluate(
                        f"{name}/{sub['name']}",
                        sub,
                        by_name,
                        devices,
                        held,
                        tuple(constraints.get(name, ())),
                        left,
                        spending,
                    )
                )
        else:
            reports.append(
                _evaluate(
                    name,
                    request.get("exactly") or {},
                    by_name,
                    devices,
                    held,
                    tuple(constraints.get(name, ())),
                    left,
                    spending,
                )
            )
    notes: tuple[str, ...] = ()
    if not reports:
        notes = ("the claim requests no device (spec.devices.requests is empty): it is allocated with none",)
    if any(r.get("firstAvailable") is not None for r in device_spec.get("requests") or []):
        notes = ("a prioritized list takes the first subrequest that can be allocated",)
    distinct = sorted(
        {
            str(c["distinctAttribute"])
            for c in device_spec.get("constraints") or []
            if c.get("distinctAttribute")
        }
    )
    if distinct:
        notes += (f"distinctAttribute constraints ({', '.join(distinct)}) are not checked by explain",)
    return ClaimReport(f"{meta.get('namespace') or '-'}/{meta.get('name')}", tuple(reports), notes)


def as_json(report: ClaimReport) -> dict[str, Any]:
    """The report as plain data, with each request's matching devices and verdict."""
    return {
        "claim": report.claim,
        "notes": list(report.notes),
        "requests": [
            {
                **asdict(request),
                "matching": request.matching,
                "available": request.available,
                "errors": request.errors,
                "verdict": request.verdict(),
            }
            for request in report.requests
        ],
    }


def render(report: ClaimReport) -> str:
    """A plain-text report."""
    lines = [f"claim {report.claim}"]
    for request in report.requests:
        wanted = "all" if request.mode == "All" else f"{request.count}"
        lines.append(f"  request {request.name!r}: {wanted} device(s) of class {request.device_class}")
        for constraint in request.constraints:
            lines.append(f"    constraint: matchAttribute {constraint}")
        for device in request.devices:
            status = "match" if device.matched else ("ERROR" if device.error else "no")
            busy = f" (in use by {device.in_use_by})" if device.in_use_by and device.matched else ""
            if device.short_of and device.matched and not device.in_use_by:
                busy = f" (not free: {device.short_of})"
            lines.append(f"    {device.device:<26} {status}{busy}")
            for selector in device.selectors:
                if selector.matched:
                    continue
                lines.append(f"      {selector.source}: {selector.expression}")
                for reason in selector.reasons or (selector.error or "false",):
                    lines.append(f"        - {reason}")
        lines.append(f"    => {request.verdict()}")
        lines.extend(f"    note: {note}" for note in request.notes)
    lines.extend(f"  note: {note}" for note in report.notes)
    return "\n".join(lines)
