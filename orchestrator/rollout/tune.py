"""`tune`: deploy each candidate layout of a model through a normal safe switch, benchmark it, keep
the winner.

Runs in-process under a per-host tune lock (each switch takes the host lock as usual). The run and
every finished measurement are recorded (adapters/tune_store.py) before the next candidate starts,
so ``resume`` continues a crashed run without measuring a candidate twice and ``abort`` brings
back what served before.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator import resources, userfiles
from orchestrator import settings as settings_mod
from orchestrator.adapters.smoke import bench_record
from orchestrator.adapters.tune_store import TuneStore
from orchestrator.contract.args import TuneArgs
from orchestrator.core import planner
from orchestrator.core import tune as core
from orchestrator.core.catalog import Catalog
from orchestrator.core.documents import DocumentError, json_document, text_of, toml_document
from orchestrator.core.planner_arch import check_model_config
from orchestrator.core.records import SwitchResult
from orchestrator.core.states import LOADING, Phase
from orchestrator.core.tune_records import TuneResult, TuneRun
from orchestrator.core.tune_toml import edit_model, layout_changes, unified_diff
from orchestrator.deploy.locks import activity_lock
from orchestrator.deploy.operations import Operations
from orchestrator.deploy.preflight import hardware_of
from orchestrator.errors import AgentError, UsageError
from orchestrator.loadgen import BenchPlan, BenchTarget, run_bench_blocking
from orchestrator.ports import ProgressCallback

_LAYOUT_KEYS = {"tensor_parallel": 1, "pipeline_parallel": 1, "data_parallel": 1, "expert_parallel": False}


@dataclass(frozen=True)
class TuneRequest:
    model: str
    layouts: tuple[planner.Layout, ...] | None
    top: int
    seqs: tuple[int | None, ...]
    objective: str
    bench: BenchPlan
    repeats: int
    restore: bool
    model_config: dict[str, Any] | None = None


def request_of(args: TuneArgs) -> TuneRequest:
    """A tune request from its contract arguments (an agent's client sent them), checked as the CLI checks."""
    levels = tuple(args.concurrency)
    plan = BenchPlan(
        concurrency=levels,
        max_tokens=args.max_tokens,
        prompt_tokens=args.prompt_tokens,
        duration_s=args.duration_s,
        requests=args.requests,
    )
    obj = args.objective or f"throughput@{max(levels)}"
    core.parse_objective(obj, levels)
    layouts = core.parse_layouts(args.layouts) if args.layouts is not None else None
    return TuneRequest(
        args.model,
        layouts,
        args.top,
        core.parse_seqs(args.seqs),
        obj,
        plan,
        args.repeats,
        args.restore,
        dict(args.config_json) if args.config_json is not None else None,
    )


@dataclass(frozen=True)
class Prepared:
    request: TuneRequest
    host: str
    candidates: tuple[core.Candidate, ...]
    previous_revision: int | None
    previous_model: str | None
    estimate: str

    def summary(self) -> dict[str, Any]:
        """What the CLI shows before anything stops (the same for a run in this process or in an agent)."""
        req = self.request
        return {
            "model": req.model,
            "host": self.host,
            "objective": req.objective,
            "concurrency": list(req.bench.concurrency),
            "restore": req.restore,
            "estimate": self.estimate,
            "candidates": [{"label": c.label, "name": c.name} for c in self.candidates],
            "previous_model": self.previous_model,
            "previous_revision": self.previous_revision,
        }


def tune_store(catalog: Catalog) -> TuneStore:
    return TuneStore(Path(catalog.state_dir) / "state.db", group=catalog.socket_group)


class Tuner:
    def __init__(
        self,
        ops: Operations,
        config_path: Path | None,
        progress: ProgressCallback | None = None,
        *,
        should_stop: Callable[[], bool] | None = None,
        should_park: Callable[[], bool] | None = None,
    ) -> None:
        """``config_path``: the deploy.toml the winner's diff is of (None: no diff); asked before each
        candidate: ``should_stop`` (an agent's `tune --abort` of a running run) True ends the run aborted,
        ``should_park`` (the agent stops) True leaves it unfinished for the agent's restart to resume."""
        self.ops = ops
        self.should_stop = should_stop or (lambda: False)
        self.should_park = should_park or (lambda: False)
        self.catalog = ops.catalog
        self.config_path = config_path
        self.store = tune_store(ops.catalog)
        self.progress: ProgressCallback = progress or (lambda e, f: None)

    # -- before anything stops --------------------------------------------------------------------
    def prepare(self, req: TuneRequest) -> Prepared:
        """Stage the weights once, run the planner on the host's config.json, pick the candidates.

        Raises UsageError (nothing stopped, nothing deployed) for a refused layout or an unfinished run.
        """
        model = self.catalog.model(req.model)
        host = self.catalog.model_host(req.model)
        self._no_unfinished(host.name)
        core.parse_objective(req.objective, req.bench.concurrency)
        offline = req.model_config if req.model_config is not None else _local_config(model.config)
        for lay in req.layouts or ():  # what the arguments alone decide, before the host is contacted
            core.variant_gpus(model, lay, host.gpus)
            for seqs in req.seqs:
                core.variant_name(model.name, lay, seqs)
            why = planner.shape_reasons(offline, lay, engine=model.engine) if offline is not None else ()
            if why:
                raise UsageError(
                    f"tune {req.model}: layout {core.token(lay)} cannot load: {'; '.join(why)}; nothing was deployed"
                )
        ports = self.ops.ports_for(host.name)
        model_dir = self.ops.deployer().spec_for(model).model_dir
        if model.source != "none" and ports.weights is not None:
            self.progress("tune_staging", {"model": req.model})
            model_dir = str(self.ops.stage(req.model, progress=self.progress)["path"])
        config = (
            req.model_config
            if req.model_config is not None
            else _read_json(ports.shell.read_file(f"{model_dir}/config.json"), f"{host.name}:{model_dir}/config.json")
        )
        if config is None:
            raise UsageError(
                f"tune {req.model}: no config.json in {model_dir} on host {host.name} to plan the "
                "layouts from; pass --model-config PATH"
            )
        check_model_config(
            config, "--model-config" if req.model_config is not None else f"{host.name}:{model_dir}/config.json"
        )
        index = _read_json(ports.shell.read_file(f"{model_dir}/model.safetensors.index.json"), "index")
        hw = hardware_of(ports.gpus.snapshot(), host.gpu_memory_gib, host.interconnect)
        wl = planner.Workload(
            max_model_len=model.max_model_len,
            gpu_memory_utilization=model.gpu_memory_utilization or self.catalog.defaults.gpu_memory_utilization,
        )
        weight_bytes = planner.weight_bytes_from_index(index) if index else None
        sel = core.select(model, config, hw, wl, weight_bytes, req.layouts, req.top, req.seqs)
        if sel.refused:
            raise UsageError(
                f"tune {req.model}: "
                + " | ".join(
                    f"layout {core.token(r.layout)} cannot load on host {host.name}: {r.reason}" for r in sel.refused
                )
                + "; nothing was deployed"
            )
        if not sel.candidates:
            raise UsageError(f"tune {req.model}: no layout of it can load on host {host.name}")
        for cand in sel.candidates:
            core.variant(model, cand, host.gpus)  # a layout wider than the host fails here, not mid-run
        serving = self.ops.serving(host.name)
        deadline = model.load_deadline_s or self.catalog.defaults.load_deadline_s
        est = core.estimate(
            len(sel.candidates),
            deadline,
            self._typical_load(host.name, req.model),
            len(req.bench.concurrency),
            req.bench.duration_s,
            req.bench.requests,
            req.repeats,
        )
        return Prepared(
            req,
            host.name,
            sel.candidates,
            serving.revision if serving else None,
            serving.model if serving else None,
            est,
        )

    def _no_unfinished(self, host: str) -> None:
        run = self.store.unfinished(host)
        if run is not None:
            done = len(self.store.results(run.id))
            raise UsageError(
                f"tune run #{run.id} of {run.model} on host {host} is unfinished ({done} of "
                f"{len(run.settings['candidates'])} candidates measured): `orchestrator tune --resume`"
                " finishes it, `orchestrator tune --abort` brings back what served before"
            )

    def _typical_load(self, host: str, model: str) -> float | None:
        for dep in self.ops.deployments(host, limit=200):
            if dep.phase is Phase.ACTIVE and (dep.model == model or dep.model.startswith(model + ".")):
                secs = [t.seconds for t in dep.timings if t.phase in LOADING and t.seconds]
                if secs:
                    return float(sum(secs))
        return None

    # -- the run ----------------------------------------------------------------------------------
    def start(self, prep: Prepared) -> dict[str, Any]:
        req = prep.request
        settings = {
            "candidates": [c.to_dict() for c in prep.candidates],
            "objective": req.objective,
            "bench": req.bench.to_dict(),
            "repeats": req.repeats,
            "restore": req.restore,
            "previous_model": prep.previous_model,
        }
        with self._lock(prep.host, req.model):
            self._no_unfinished(prep.host)
            run = self.store.create(
                prep.host, req.model, settings, prep.previous_revision, self.ops.ports_for(prep.host).clock.now()
            )
            return self._drive(run)

    def resume(self, host: str | None, model: str | None = None) -> dict[str, Any]:
        """Finish the host's unfinished run (``model``: the host of that model, and the run must be its)."""
        name = self.catalog.target(model, host).name
        with self._lock(name):
            run = self._unfinished(name, model, "resume")
            if self.ops.unfinished(name):  # killed mid-switch: that switch ends first, then the next candidate
                self.ops.recover(name, progress=self.progress)
            return self._drive(run)

    def _unfinished(self, host: str, model: str | None, what: str) -> TuneRun:
        run = self.store.unfinished(host)
        if run is None:
            raise UsageError(f"host {host} has no unfinished tune run to {what}")
        if model is not None and run.model != model:
            raise UsageError(
                f"tune --{what} {model}: the unfinished tune run #{run.id} on host {host} tunes "
                f"{run.model}, not {model} (`orchestrator tune --{what}` acts on it)"
            )
        return run

    def abort(self, host: str | None, model: str | None = None) -> dict[str, Any]:
        name = self.catalog.target(model, host).name
        with self._lock(name):
            return self._aborted(self._unfinished(name, model, "abort"))

    def _aborted(self, run: TuneRun) -> dict[str, Any]:
        self.ops.recover(run.host, progress=self.progress)
        back = self._restore(run)
        self.store.finish(run.id, "aborted", self.ops.ports_for(run.host).clock.now(), None)
        return {"run": run.id, "model": run.model, "host": run.host, "state": "aborted", "serving": back}

    def _lock(self, host: str, model: str | None = None) -> Any:
        run = None if model is not None else self.store.unfinished(host)
        model = model or (run.model if run is not None else None)
        return activity_lock(
            self.catalog.state_dir, host, "tune", f"a tune of {model} is running" if model else "a tune run is running"
        )

    def _variants_ops(self, run: TuneRun, cands: list[core.Candidate]) -> Operations:
        if run.model not in self.catalog.models:
            raise UsageError(f"tune run #{run.id}: model {run.model!r} is no longer in the catalog")
        base = self.catalog.models[run.model]
        host = self.catalog.model_host(run.model)
        variants = {c.name: core.variant(base, c, host.gpus) for c in cands}
        # Not re-validated on purpose: the variants share the model's port, which the catalog refuses
        # for models that could serve together; these replace each other, one at a time.
        catalog = self.catalog.model_copy(update={"models": {**self.catalog.models, **variants}})
        return Operations(
            catalog,
            self.ops.ports_for,
            store=self.ops.store,
            template=self.ops.template,
            before_step=self.ops.before_step,
        )

    def _drive(self, run: TuneRun) -> dict[str, Any]:
        cands = [core.Candidate.from_dict(c) for c in run.settings["candidates"]]
        vops = self._variants_ops(run, cands)
        bench = BenchPlan.from_dict(run.settings["bench"])
        repeats = int(run.settings["repeats"])
        obj = core.parse_objective(run.settings["objective"], bench.concurrency)
        done = {r.candidate for r in self.store.results(run.id)}
        for i, cand in enumerate(cands, 1):
            if cand.name in done:
                self.progress("tune_skip", {"candidate": cand.name, "why": "measured before the resume"})
                continue
            if self.should_stop():
                self.progress("tune_aborting", {"run": run.id, "before": cand.name})
                return self._aborted(run)
            if self.should_park():
                raise AgentError(
                    f"tune run #{run.id} of {run.model} on host {run.host} parked before {cand.name}: "
                    "the agent is stopping; it resumes the run when it starts again"
                )
            self.progress(
                "tune_candidate", {"candidate": cand.name, "layout": cand.label, "index": i, "of": len(cands)}
            )
            self._measure(run, vops, cand, bench, repeats)
        results = {r.candidate: r for r in self.store.results(run.id)}
        measured = [
            core.Measured(
                c,
                vops.catalog.models[c.name].tensor_parallel
                * vops.catalog.models[c.name].pipeline_parallel
                * vops.catalog.models[c.name].data_parallel,
                tuple(results[c.name].records),
                results[c.name].error,
                results[c.name].revision,
            )
            for c in cands
        ]
        decision = core.decide(obj, measured)
        if run.settings["restore"] or decision.winner is None:
            serving = self._restore(run)
        else:
            serving = self._keep(vops, run, decision.winner)
        report = self._report(run, cands, results, decision, serving)
        self.store.finish(run.id, "done", self.ops.ports_for(run.host).clock.now(), report)
        return report

    def _measure(self, run: TuneRun, vops: Operations, cand: core.Candidate, bench: BenchPlan, repeats: int) -> None:
        res = SwitchResult.from_dict(vops.switch(cand.name, trigger=f"tune:{run.id}", progress=self.progress))
        clock = self.ops.ports_for(run.host).clock
        layout = core.token(cand.layout)
        if not res.ok:
            detail = str(res.error or res.ended)
            line = core.engine_error_line(detail)
            self.progress("tune_failed", {"candidate": cand.name, "error": line, "outcome": res.ended})
            self.store.record(
                TuneResult(
                    run.id, cand.name, layout, "failed", res.deployment_id, res.revision, line, detail, [], clock.now()
                )
            )
            return
        dep = self.ops.serving(run.host)
        assert dep is not None and dep.model == cand.name
        target = BenchTarget(base_url=dep.spec.base_url, model=dep.spec.served_name)
        records = []
        for rep in range(repeats):
            self.progress("tune_bench", {"candidate": cand.name, "repeat": rep + 1, "of": repeats})
            records.append(bench_record(run_bench_blocking(target, bench).to_dict()))
        # Stored with the revision too, so `compare` lists the layout later like any benchmark.
        self.ops.record_bench(dep.id, {**records[-1], "tune_run": run.id})
        self.store.record(
            TuneResult(run.id, cand.name, layout, "ok", dep.id, dep.revision, None, None, records, clock.now())
        )

    def _keep(self, vops: Operations, run: TuneRun, winner: core.Candidate) -> dict[str, Any]:
        serving = self.ops.serving(run.host)
        if serving is None or serving.model != winner.name:
            self.progress("tune_winner", {"candidate": winner.name, "action": "switching back to it"})
            vops.switch(winner.name, trigger=f"tune:{run.id}:winner", progress=self.progress)
        return self._serving(run.host)

    def _restore(self, run: TuneRun) -> dict[str, Any]:
        """What served before the run serves again (its exact recorded unit); nothing, if nothing did."""
        serving = self.ops.serving(run.host)
        prev = run.previous_revision
        if prev is not None and (serving is None or serving.revision != prev):
            self.progress("tune_restore", {"to_revision": prev})
            self.ops.rollback(run.host, to_revision=prev, trigger=f"tune:{run.id}:restore", progress=self.progress)
        elif prev is None and serving is not None:
            self.ops.stop_serving(run.host, reason=f"tune:{run.id}:restore (nothing served before the run)")
        return self._serving(run.host)

    def _serving(self, host: str) -> dict[str, Any]:
        s = self.ops.serving(host)
        return {} if s is None else {"model": s.model, "revision": s.revision, "unit": s.spec.unit_name}

    # -- the report -------------------------------------------------------------------------------
    def _report(
        self,
        run: TuneRun,
        cands: list[core.Candidate],
        results: dict[str, TuneResult],
        decision: core.Decision,
        serving: dict[str, Any],
    ) -> dict[str, Any]:
        rows = []
        scores = {r.candidate.name: r.score for r in decision.ranking}
        for c in cands:
            r = results[c.name]
            last = r.records[-1] if r.records else {}
            levels = {
                str(lv["concurrency"]): {
                    "tok_s": lv["output_tok_s"],
                    "ttft_p90_ms": (lv.get("ttft_ms") or {}).get("p90"),
                    "errors": sum((lv.get("errors") or {}).values()),
                }
                for lv in last.get("levels", [])
            }
            rows.append(
                {
                    "candidate": c.name,
                    "layout": c.label,
                    "status": r.status,
                    "revision": r.revision,
                    "error": r.error,
                    "score": scores.get(c.name),
                    "levels": levels,
                    "winner": decision.winner is not None and decision.winner.name == c.name,
                }
            )
        diff, changes = self._changes(run.model, decision.winner)
        return {
            "run": run.id,
            "host": run.host,
            "model": run.model,
            "concurrency": BenchPlan.from_dict(run.settings["bench"]).concurrency,
            "candidates": rows,
            "decision": decision.to_dict(),
            "serving": serving,
            "previous_revision": run.previous_revision,
            "diff": diff,
            "changes": changes,
        }

    def _changes(self, model: str, winner: core.Candidate | None) -> tuple[str | None, dict[str, Any]]:
        """The unified diff of deploy.toml that gives MODEL the winner's layout, and the keys it sets."""
        if winner is None or self.config_path is None:
            return None, {}
        try:
            text = text_of(userfiles.read_bytes(self.config_path), str(self.config_path))
            current = toml_document(text, str(self.config_path))["models"][model]
        except (OSError, DocumentError, KeyError):
            return None, {}
        base = self.catalog.models[model]
        target: dict[str, Any] = {
            "tensor_parallel": winner.layout.tp,
            "pipeline_parallel": winner.layout.pp,
            "data_parallel": winner.layout.dp,
            "expert_parallel": winner.layout.ep,
            "gpus": core.variant_gpus(base, winner.layout, self.catalog.model_host(model).gpus),
        }
        if winner.max_num_seqs is not None:
            target["max_num_seqs"] = winner.max_num_seqs
        changes = layout_changes(current, target, _LAYOUT_KEYS)
        if not changes:
            return "", {}
        new = edit_model(text, model, changes, str(self.config_path))
        return unified_diff(text, new, self.config_path.name), changes

    def apply(self, model: str, report: dict[str, Any]) -> bool:
        """Write the winner's layout into deploy.toml (checked to load first); False when nothing changes."""
        changes = report.get("changes") or {}
        if not changes or self.config_path is None:
            return False
        new = edit_model(userfiles.read_text(self.config_path), model, changes, str(self.config_path))
        fd, tmp = tempfile.mkstemp(dir=self.config_path.parent, prefix=".deploy.", suffix=".toml")
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(new)
            settings_mod.load(tmp)  # the edited file must still be a valid catalog
            os.chmod(tmp, self.config_path.stat().st_mode & 0o7777)
            os.replace(tmp, self.config_path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return True


def _read_json(raw: bytes | str | None, what: str) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        data = json_document(raw, what, unique_keys=False)  # config.json or index: as the engine's loader reads it
    except DocumentError as exc:
        raise UsageError(f"{what}: {exc.reason}") from None
    return data if isinstance(data, dict) else None


def _local_config(path: str | None) -> dict[str, Any] | None:
    """The model's `config` (a config.json here, validated when the catalog loaded), or None."""
    if path is None:
        return None
    try:
        raw = resources.shipped_config(path)
        data = json_document(userfiles.read_bytes(path) if raw is None else raw, path, unique_keys=False)
    except (OSError, DocumentError):
        return None  # the host's own config.json decides, as before
    return data if isinstance(data, dict) else None
