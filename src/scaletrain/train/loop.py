"""The training loop shared by every workload and every strategy: one process's steps.

Outputs in ``config.out`` (written by the coordinating process): ``summary.json``,
``metrics.jsonl``, ``model.pt`` (a plain state_dict), ``checkpoint.pt`` (for ``--resume``) and
TensorBoard events under ``tb/``. A worker of a distributed run runs the same loop with its
:class:`~scaletrain.train.plan.WorkerPlan` and a gradient exchange; see :mod:`scaletrain.parallel`.
The run is built by :mod:`scaletrain.train.build`; its parts and contracts are in
:mod:`scaletrain.train.state`, its records in :mod:`scaletrain.train.records`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from scaletrain.efficient import EpochEnd, Reconfiguration, stacked
from scaletrain.tensors.device import synchronize, to_device
from scaletrain.train.accumulate import micro_batches
from scaletrain.train.checkpoint import CHECKPOINT_NAME, EXCHANGE_NAME, atomic_save, checkpoint_payload
from scaletrain.train.divergence import Diverged, check_loss, loss_bound
from scaletrain.train.exchange import ExchangeTimes, PeerLost
from scaletrain.train.membership import MembershipLog, admit, regroup
from scaletrain.train.meter import EpochSteps, ThroughputMeter, now, timed_batches
from scaletrain.train.peak import step_peak
from scaletrain.train.plan import WorkerPlan
from scaletrain.train.reconfigure import apply_decision, describe_decision
from scaletrain.train.records import RunRecords
from scaletrain.train.schedule import Position
from scaletrain.train.state import Prepared, Role, checkpoint_due, learning_rate_at_step
from scaletrain.train.summary import WorkerStats, weights_digest

__all__ = ["Diverged", "Trainer"]


class Trainer:
    """One process's training loop; the mutable parts live here so the loop reads as named steps."""

    def __init__(self, prepared: Prepared, role: Role) -> None:
        self.prepared, self.role = prepared, role
        config = prepared.config
        self.config, self.workload, self.model = config, prepared.workload, prepared.model
        self.optimizer, self.data, self.schedule = prepared.optimizer, prepared.data, prepared.schedule
        self.position = Position(**asdict(prepared.position))
        self._first_step = self.position.step  # of a resumed run, or of a worker that joined one mid-run
        self.state = prepared.state
        self.technique = prepared.technique
        # entered around each training forward pass: the activations' layout, then the technique's (autocast)
        self._forward = stacked(prepared.layout, self.technique)
        self.meter = ThroughputMeter(config.warmup_steps)
        self.communication = self.wait = self.batch_wait = self.host_copy = 0.0  # batch_wait: the steps' data part
        self.skipped_steps = self.gradient_bytes_sent = 0
        self.records = RunRecords(prepared, writes=role.coordinator)
        self.last_loss: float | None = None
        self.first_loss: float | None = None  # this process's first and last training loss: did it fall?
        self._step_loss: torch.Tensor | None = None
        self._buffer_seconds = 0.0  # averaging the workers' buffers within this step
        self.last_quality: tuple[int, dict[str, float]] | None = None
        self._loss_sum = torch.zeros((), device=prepared.device)  # the losses' device: no copy per step
        self._loss_count = 0
        self._epoch_started = time.time()
        self._epoch_steps = EpochSteps()
        self._named_parameters = dict(self.model.named_parameters())  # made again when the network changes
        self.membership = MembershipLog(self.position.step)  # an elastic run's changes (``membership`` in the summary)
        self.bound = loss_bound(config, prepared.first_losses)  # fills prepared.first_losses, which checkpoints keep
        role.exchange.skip_nonfinite = self.technique is not None and self.technique.skips_nonfinite

    def train(self) -> None:
        self.role.exchange.start(self.model, self.optimizer)
        self._resume_exchange()
        self._start_techniques()
        schedule = self.schedule
        while schedule.first_step(self.position.epoch) < schedule.total_steps:
            epoch = self.position.epoch
            steps = schedule.steps_in(epoch)
            stop = min(steps, schedule.total_steps - schedule.first_step(epoch))
            self._train_epoch(stop)
            if stop < steps:
                break  # --steps ended the run inside this epoch
            self._end_epoch()
        self.role.agreement.buffers_final(self.model)

    def _start_techniques(self) -> None:
        """Start the techniques that keep no state (synchronised batch norm takes its group here), then the
        technique stack; a run resumed before an epoch's decision takes that decision now."""
        stacks = [stack for stack in (self.prepared.layout, self.technique) if stack is not None]
        if not stacks:
            return
        plan = self.role.plan
        context = self.prepared.technique_context(
            mean=self.role.agreement.mean,
            epoch=lambda: self.position.epoch,
            step_peak=self._step_peak,
            batch_share=plan.global_batch_factor / plan.part.count / self.prepared.async_split,
            batch_group=self.role.batch_group,
        )
        for stack in stacks:
            stack.start(self.model, context)
        resumed_undecided = self.position.batch == 0 and self.prepared.decided_epochs < self.position.epoch
        if self.technique is not None and resumed_undecided:
            # resumed from a checkpoint written at an epoch's end before that epoch's decision
            self._decide(self.position.epoch - 1)

    def _train_epoch(self, stop: int) -> None:
        """The epoch's global batches from the current one to ``stop``; in an elastic run, a lost worker's
        survivors regroup and go on from the step in flight with the rest of the epoch re-partitioned, and a worker
        admitted at a step boundary has the rest re-partitioned the same way."""
        self._epoch_started = time.time()
        self._epoch_steps = EpochSteps()
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate_at_step(self.prepared, self.schedule.first_step(self.position.epoch))
        while True:
            try:
                if self._train_batches(self.role.plan.numbers(self.position.batch, stop)):
                    return
            except PeerLost as lost:  # raised only by the exchange of an elastic run, before any update
                regroup(self, lost)  # agree on who goes on, take the live state of the one furthest ahead

    def _train_batches(self, numbers: range) -> bool:
        """Whether every one of ``numbers`` was trained (not: a worker was admitted after one of them)."""
        config, position, plan = self.config, self.position, self.role.plan
        batches = self.workload.train_batches(
            self.data,
            epoch=position.epoch,
            batch_size=self.prepared.update_batch * plan.global_batch_factor,
            seed=config.seed,
            part=plan.part,
            numbers=numbers,
        )
        if self.state is None:
            rows = self.prepared.update_batch * plan.global_batch_factor // plan.part.count
            self.state = self.workload.initial_state(self.model, rows)
        # closed however the epoch ends, so that a loader's worker processes stop with it
        with contextlib.closing(timed_batches(batches)) as timed:
            return self._steps(numbers, timed)

    def _steps(self, numbers: range, batches: Iterator[tuple[float, float, Any]]) -> bool:
        prepared, config, position = self.prepared, self.config, self.position
        device = prepared.device
        for number, (begin, fetched, batch) in zip(numbers, batches, strict=True):
            rate = learning_rate_at_step(self.prepared, position.step)  # per update: schedules, warm-ups
            for group in self.optimizer.param_groups:
                group["lr"] = rate
            loss = self._gradient(to_device(batch, device))
            if self.technique is not None:
                self.technique.after_backward(self.model)
            if checkpoint_due(self.prepared, position.step + 1):  # the model may leave a process after it
                shared = now()
                self.role.agreement.buffers_due(position.step + 1, self.model)
                self._buffer_seconds = now() - shared
            times = self.role.exchange.step(self.model, self.optimizer, config.clip_norm)
            if self.technique is not None:
                if self.role.exchange.updates_here and not times.skipped:
                    self.technique.after_update(self._named_parameters, self.optimizer.param_groups[0]["lr"])
                self.technique.after_exchange(times.skipped)
            self.skipped_steps += times.skipped
            self.gradient_bytes_sent += times.sent_bytes
            synchronize(device)  # the step's queued device work is done before the clock is read
            seconds = now() - begin
            self.meter.add(seconds)
            self._epoch_steps.add(seconds, times.communication, fetched - begin)
            if self.meter.measured_steps:  # after the warm-up, like the throughput
                self.communication += times.communication + self._buffer_seconds
                self.wait += times.wait
                self.host_copy += times.host_copy
                self.batch_wait += fetched - begin
            self._buffer_seconds = 0.0
            if self.first_loss is None:
                self.first_loss = float(loss)
            self._step_loss = loss
            self._loss_sum += loss
            self._loss_count += 1
            position.batch = number + 1
            position.step += 1
            if self.membership.recovering:
                self.membership.step_done(self.records.metrics)
            self._after_step(loss)
            joining = self.role.membership is not None and self.role.membership.join_due
            if joining and position.step < self.schedule.total_steps:  # after the last, it is refused at the end
                admit(self)  # a worker joins at this step boundary: the rest of the batches are cut anew
                return False
        return True

    def _gradient(self, batch: Any) -> torch.Tensor:
        """Forward and backward over ``batch`` (as ``--accumulate`` micro-batches, each objective weighted by its
        share of the rows, so that their gradients sum to the whole batch's); its loss."""
        self.optimizer.zero_grad(set_to_none=True)
        trained = self.prepared.forward.module  # the model, or its compiled wrapper (--compile)
        total = None
        for part, share in micro_batches(batch, self.config.accumulate):
            with self._forward_context():
                objective, loss, self.state = self.workload.training_loss(trained, part, self.state)
            self._check_finite(loss)
            if self.technique is not None:
                objective = self.technique.objective(objective, self.model)
            (objective * share if share != 1.0 else objective).backward()
            total = loss * share if total is None else total + loss * share
        return total

    def _step_peak(self, model: nn.Module, rows: int) -> int | None:
        return step_peak(self.prepared, self.role.plan, model, rows, self._forward_context)

    def _forward_context(self) -> contextlib.AbstractContextManager:
        return self._forward.forward_context() if self._forward is not None else contextlib.nullcontext()

    def _example_inputs(self) -> Any:
        return to_device(self.workload.example_inputs(self.data), self.prepared.device)

    def _check_finite(self, loss: torch.Tensor) -> None:
        """Stop before a nan or infinite loss turns into gradients that reach the other processes, and when a
        finite loss has stayed past the divergence bound (:func:`~scaletrain.train.divergence.check_loss`)."""
        check_loss(loss, self.bound, self.position, self.optimizer.param_groups[0]["lr"])

    def _after_step(self, loss: torch.Tensor) -> None:
        config, step = self.config, self.position.step
        periodic = step % config.log_every == 0 or step == self.schedule.total_steps
        if periodic and self.records.metrics is not None:
            # .item() waits for the device; only pay for it when logging.
            self.last_loss = loss.item()
            rate = self.meter.take_window()
            plan = self.role.plan  # the rows one step of this worker computes
            rows = self.prepared.update_batch * plan.global_batch_factor / plan.part.count
            samples = None if rate is None else rate * rows
            lr = self.optimizer.param_groups[0]["lr"]
            self.records.step(step, self.position.epoch, self.last_loss, lr, rate, samples)
        self.records.progress.update(
            step, self.position.epoch, self.last_loss, self.meter.batches_per_second(), periodic=periodic
        )
        # an epoch's last step is saved by _end_epoch, after the technique's decision
        if checkpoint_due(self.prepared, step) and not self.schedule.epoch_ends_at(step):
            self._save_exchange()
            if self.role.checkpoints:
                self.save_checkpoint()

    def _end_epoch(self) -> None:
        epoch = self.position.epoch
        train_loss = (self._loss_sum / max(self._loss_count, 1)).item()
        self._loss_sum, self._loss_count = torch.zeros((), device=self.prepared.device), 0
        self.position.epoch += 1
        self.position.batch = 0
        self.state = None
        self._log_epoch(epoch, train_loss)
        if self.technique is not None:
            self._decide(epoch)
        technique = self.technique.state_dict() if self.technique is not None else None
        # a central parameter server writes the checkpoints and sees no loss: it keeps the deciding worker's
        self.role.agreement.share({"technique": technique, "first_losses": list(self.prepared.first_losses)})
        self._save_exchange()
        if self.role.checkpoints:  # after the decision: a resumed run rebuilds the network it made
            self.save_checkpoint()

    def _log_epoch(self, epoch: int, train_loss: float) -> None:
        evaluate = (lambda: self.workload.evaluate(self.model, self.data)) if self.role.evaluate_each_epoch else None
        quality = self.records.epoch(
            epoch=epoch,
            step=self.position.step,
            train_loss=train_loss,
            seconds=time.time() - self._epoch_started,
            model=self.model,
            steps=self._epoch_steps,
            evaluate=evaluate,
        )
        if quality is not None:
            self.last_quality = (self.position.step, quality)

    def _decide(self, epoch: int) -> None:
        """The technique's decision after ``epoch``, agreed by every process, applied at this step boundary. A
        technique chosen by name decides on the workers' shared weights (diloco takes an outer step first)."""
        if self.config.technique is not None:
            self.count_owed(self.role.exchange.settle(self.model))
        end = EpochEnd(epoch=epoch, batch_size=self.prepared.batch_size, step=self.schedule.first_step(epoch + 1))
        decision = self.role.agreement.agree(
            epoch, lambda: self.technique.amend(self.technique.epoch_end(end, self.model), end, self.model)
        )
        self.prepared.decided_epochs = epoch + 1  # before any checkpoint of the new network is written
        if decision is not None:
            self._reconfigure(decision, epoch)

    def _reconfigure(self, decision: Reconfiguration, epoch: int) -> None:
        """Rebuild the network as ``decision`` says, carry weights and momentum over, and let the exchange
        re-make what it sized for the old network."""
        exchange, prepared = self.role.exchange, self.prepared
        recording = self.records.metrics is not None and decision.changes_network
        if decision.changes_network:
            self.count_owed(exchange.settle(self.model))
        before = self._network_record() if recording else None
        exchange.prepare_reconfiguration(self.model, self.optimizer, epoch, decision)
        apply_decision(prepared, decision, epoch)
        self.model = prepared.model
        self._named_parameters = dict(self.model.named_parameters())
        self.optimizer = prepared.optimizer
        exchange.reconfigure(self.model, self.optimizer)
        if self.technique is not None:
            self.technique.reconfigured(self.model)
        self.last_quality = None  # measured on the old network
        if before is not None:
            self._log_reconfiguration(epoch, decision, before)
        self.records.progress.message(f"after epoch {epoch + 1}: {describe_decision(prepared, decision)}")

    def _network_record(self) -> dict[str, Any]:
        return self.records.network(
            self.model, self._example_inputs(), lambda: self.workload.evaluate(self.model, self.data)
        )

    def _log_reconfiguration(self, epoch: int, decision: Reconfiguration, before: dict[str, Any]) -> None:
        after = self._network_record()
        self.records.reconfiguration(
            epoch=epoch, step=self.position.step, decision=decision, before=before, after=after, steps=self._epoch_steps
        )

    def final_quality(self) -> dict[str, float]:
        """Quality of the final weights, reusing the last epoch's evaluation when nothing changed since."""
        if self.last_quality is not None and self.last_quality[0] == self.position.step:
            return self.last_quality[1]
        return self.workload.evaluate(self.model, self.data)

    def save_checkpoint(self) -> None:
        # A worker's carried state (an LSTM's hidden state) covers only its own rows; a distributed
        # run restarts it from zeros when resumed.
        state = self.state if self.role.plan == WorkerPlan() else None
        payload = checkpoint_payload(self.prepared, self.model, self.optimizer, self.position, state)
        atomic_save(payload, self.config.out / CHECKPOINT_NAME)

    def _exchange_file(self) -> Path:
        return self.config.out / EXCHANGE_NAME.format(rank=self.role.rank)

    def _save_exchange(self) -> None:
        """Every worker's own exchange state (its wire codec's residuals differ from the others'), beside
        the checkpoint the coordinator writes at the same step."""
        state = self.role.exchange.state_dict()
        if state is not None and self.config.out.is_dir():  # a node without the run folder keeps none
            atomic_save({"step": self.position.step, "state": state}, self._exchange_file())

    def _resume_exchange(self) -> None:
        """A resumed run's exchange goes on from the state saved at the checkpoint's step (none saved, or
        saved at another step: it starts afresh, as an older run's checkpoint does)."""
        path = self._exchange_file()
        if self.prepared.resumed_from is None or not path.exists():
            return
        saved = torch.load(path, weights_only=False)
        if saved["step"] == self.prepared.resumed_from:
            self.role.exchange.load_state_dict(saved["state"])

    def count_owed(self, times: ExchangeTimes | None) -> None:
        """An exchange made between steps (diloco's outer step after the last step, or before a decision) is
        training: its bytes count with the steps', its seconds with the measured steps' (as communication and wait)."""
        if times is None:
            return
        self.gradient_bytes_sent += times.sent_bytes
        if self.meter.measured_steps:
            self.meter.measured_seconds += times.communication + times.wait
            self.communication += times.communication
            self.wait += times.wait

    def stats(self) -> WorkerStats:
        """This worker's measurements, for the summary."""
        return WorkerStats(
            rank=self.role.rank,
            steps=self.position.step - self._first_step,
            measured_steps=self.meter.measured_steps,
            measured_seconds=self.meter.measured_seconds,
            communication_seconds=self.communication,
            wait_seconds=self.wait,
            data_seconds=self.batch_wait,
            batch_fraction=self.role.plan.batch_fraction,
            final_loss=self.last_loss,
            first_step_loss=self.first_loss,
            last_step_loss=float(self._step_loss) if self._step_loss is not None else None,
            minor_faults_per_step=self.meter.minor_faults_per_step(),
            skipped_steps=self.skipped_steps,
            host_copy_seconds=self.host_copy,
            gradient_bytes_sent=self.gradient_bytes_sent,
            loss_scale=self.technique.loss_scale if self.technique is not None else None,
            weights_digest=weights_digest(self.model),
            compile_seconds=self.prepared.forward.compile_seconds,
        )

    def close(self) -> None:
        self.records.close()
