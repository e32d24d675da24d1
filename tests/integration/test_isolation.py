"""A server that stalls never slows or stops training: the sender thread may hang, the training
thread does not. Real sockets on loopback; each test prints its figure.

The reference is a twin: the same model and hook pointed at a port that refuses connections at
once (the same measuring, no network wait), stepped in turn with the hooked one, so that load on
the machine weighs on both alike (a reference timed before the hooked steps read 0.07x to 3.7x
on a loaded machine). The bound asserted is loose (1.5x): it catches a training thread that waits
on the network (seconds per step), not noise; the printed ratio is the figure."""

from __future__ import annotations

import socket
import statistics
import threading
import time
from pathlib import Path

import pytest
import torch
from websockets.sync.server import serve

import gradwatch
from gradwatch.spool import read_records
from support.wiresteps import spooled_steps

#: asserts on wall-clock time: `make test` runs it alone, after the parallel tests
pytestmark = pytest.mark.timed


#: The width of test_a_server_that_stops_reading_mid_run's model (the others': 512). A step's time
#: is mostly the optimizer's and the hook's work on every parameter (Adam's single-tensor CPU step,
#: the norms), a quarter of it at 256; the hook sends as many messages a step. Its steps are
#: paired after 160 others, the sender in its steady state: the tests that pair steps from
#: watch() on keep steps long enough that the sender's start weighs on a few of them only (at
#: 256, the never-answering handshake's median read 1.9x once, at load 5).
STALLED_WIDTH = 256


def step_times(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int) -> list[float]:
    times = []
    width = next(model.parameters()).shape[1]  # the first Linear's in_features
    x = torch.randn(width // 2, width)
    for _ in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return times


def model_and_optimizer(width: int = 512) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(4)])
    return model, torch.optim.Adam(model.parameters())


Trained = tuple[torch.nn.Module, torch.optim.Optimizer]


def refused_port() -> int:
    refused = socket.socket()
    refused.bind(("127.0.0.1", 0))
    port: int = refused.getsockname()[1]
    refused.close()
    return port


def paired_ratios(hooked: Trained, ref: Trained, steps: int) -> list[float]:
    """Per step, a hooked step's time over its reference twin's, taken one right after the other
    (in turn first and second): load on the machine meanwhile weighs on both alike."""
    ratios = []
    for k in range(steps):
        first, second = (hooked, ref) if k % 2 else (ref, hooked)
        a, b = step_times(*first, 1)[0], step_times(*second, 1)[0]
        ratios.append(a / b if first is hooked else b / a)
    return ratios


def twin(width: int = 512) -> tuple[Trained, gradwatch.Watcher]:
    """The reference: a model watched by a hook whose server refuses at once, warmed up."""
    model, opt = model_and_optimizer(width)
    w = gradwatch.watch(opt, model=model, server=f"http://127.0.0.1:{refused_port()}", warn=False)
    step_times(model, opt, 2)  # the first steps allocate
    return (model, opt), w


def stalled_after_welcome(port_holder: list[int], stop: threading.Event) -> None:
    """Answers hello, then never reads again: the hook's sends block once the socket buffers fill."""

    def handler(ws) -> None:
        hello = ws.recv()
        assert '"type":"hello"' in hello
        ws.send('{"type": "welcome", "run_id": "x", "last_seq": 0}')
        stop.wait()

    with serve(handler, "127.0.0.1", 0, max_size=None) as server:
        port_holder.append(server.socket.getsockname()[1])
        threading.Thread(target=server.serve_forever, daemon=True).start()
        stop.wait()
        server.shutdown()


def test_a_server_that_never_answers_the_handshake(spool_dir: Path) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)  # accepts TCP connections (the kernel does), never speaks websocket
    port = listener.getsockname()[1]
    ref, ref_watcher = twin()
    model, opt = model_and_optimizer()
    w = gradwatch.watch(opt, model=model, server=f"http://127.0.0.1:{port}", warn=False)
    ratios = paired_ratios((model, opt), ref, 30)
    started = time.monotonic()
    w.close(timeout=2.5)  # longer than one connection attempt (2 s), so the sender gets to spool
    closing = time.monotonic() - started
    listener.close()
    ref_watcher.close(timeout=0.2)
    ratio = statistics.median(ratios)
    print(
        f"\nserver that never answers: training completed, median step x{ratio:.2f} of its twin's, close() {closing:.1f} s"
    )
    assert closing < 4.5
    assert ratio < 1.5
    records, _ = read_records(spool_dir / f"{w.run_id}.spool")
    texts = list(records)
    assert spooled_steps(texts) == list(range(1, 31)) and '"close"' in texts[-1]  # nothing lost


def test_a_server_that_stops_reading_mid_run(spool_dir: Path) -> None:
    stop = threading.Event()
    port: list[int] = []
    threading.Thread(target=stalled_after_welcome, args=(port, stop), daemon=True).start()
    while not port:
        time.sleep(0.01)
    ref, ref_watcher = twin(STALLED_WIDTH)
    model, opt = model_and_optimizer(STALLED_WIDTH)
    w = gradwatch.watch(opt, model=model, server=f"http://127.0.0.1:{port[0]}", warn=False)
    step_times(model, opt, 160)  # enough messages to fill the socket buffers
    ratios = paired_ratios((model, opt), ref, 40)  # its last 40 steps, each against a twin's
    started = time.monotonic()
    w.close(timeout=1.0)
    closing = time.monotonic() - started
    stop.set()
    ref_watcher.close(timeout=0.2)
    ratio = statistics.median(ratios)
    print(
        f"\nserver that stops reading: training completed, median step x{ratio:.2f} of its twin's, close() {closing:.1f} s"
    )
    assert closing < 3.5
    assert ratio < 1.5
    records, _ = read_records(spool_dir / f"{w.run_id}.spool")
    assert spooled_steps(records) == list(range(1, 201))  # close() spooled everything it could not send


def test_a_sender_thread_that_raises_or_hangs_never_reaches_training(spool_dir: Path) -> None:
    """The sender thread itself failing: every pump raises (a bug), or it hangs for good. The
    training loop completes at the same speed, nothing raises into it, close() stays bounded.
    Its steps are timed paired with a reference twin's (the hook with a working sender, pointed
    at a port that refuses at once), interleaved step by step: a reference taken before the hooked
    steps counted the load that came between them against the hook (2.2x once, on a loaded machine)."""
    steps = 40  # pairs a fault: enough for a median that a busy process beside it does not move
    figures = []
    release = threading.Event()

    def raising() -> None:
        raise RuntimeError("injected sender bug")

    def hanging() -> None:
        release.wait()

    for name, fault in (("raises", raising), ("hangs", hanging)):
        ref, ref_watcher = twin()
        model, opt = model_and_optimizer()
        w = gradwatch.watch(opt, model=model, server="http://127.0.0.1:9", warn=False)
        w._sender._pump = fault  # type: ignore[method-assign]  # this sender's next pump on, its twin's not
        step_times(model, opt, 2)  # the first steps allocate: untimed, as the twin's
        ratios = paired_ratios((model, opt), ref, steps)  # must neither raise nor wait
        started = time.monotonic()
        w.close(timeout=0.5)
        closing = time.monotonic() - started
        ref_watcher.close(timeout=0.2)
        assert w.step == steps + 2
        assert closing < 3.0, closing
        assert name == "hangs" or not w._sender._thread.is_alive()  # a failing pump ends at close()
        ratio = statistics.median(ratios)
        figures.append(f"sender {name}: median step x{ratio:.2f} of its twin's, close() {closing:.1f} s")
        assert ratio < 1.5, ratio
    release.set()
    print("\n" + "; ".join(figures))
