"""The app opens a run recorded from a Hugging Face model (dyntool.integrations.RunRecorder)."""
import json

import pytest
import torch

import dyntool

from . import fixtures

transformers = pytest.importorskip("transformers", reason="transformers not installed (pip install dyntool[hf])")
from streamlit.testing.v1 import AppTest  # noqa: E402

from dyntool.integrations import RunRecorder  # noqa: E402


@pytest.fixture(scope="module")
def hf_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_runs")
    torch.manual_seed(0)
    T = 12
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=len(fixtures.WORDS), n_positions=T, n_embd=16, n_layer=2, n_head=2,
        attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0, bos_token_id=0, eos_token_id=1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    probe = torch.arange(T).view(1, T) % len(fixtures.WORDS)
    with RunRecorder(model, root, max_steps=6, every=2, name="hf-gpt2", probe={"input_ids": probe, "labels": probe},
                     tokens=[[fixtures.WORDS[i] for i in probe[0]]]) as rec:
        for step in range(6):
            rec.probe_step(step)
            x = torch.randint(len(fixtures.WORDS), (4, T))
            loss = model(input_ids=x, labels=x).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            rec.log(step, loss=loss.item())
    return root


def _app(root, monkeypatch, page, run):
    monkeypatch.setenv("DYNTOOL_RUNS_DIR", str(root))
    at = AppTest.from_file(str(fixtures.APP_DIR / "main.py"), default_timeout=60).run()
    at.query_params["run"] = run
    at.switch_page(f"views/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_overview_and_matrices_open_an_hf_recorded_run(hf_root, monkeypatch):
    at = _app(hf_root, monkeypatch, "overview", "hf-gpt2")
    assert at.selectbox(key="ov_run").value == "hf-gpt2"
    assert len(at.get("plotly_chart")) >= 1
    at = _app(hf_root, monkeypatch, "matrices", "hf-gpt2")
    charts = at.get("plotly_chart")
    assert len(charts) == 4                                   # α, B, A, ∂L/∂S
    titles = " | ".join(json.loads(c.proto.spec)["layout"]["title"]["text"] for c in charts)
    assert "α (attention)" in titles and "A (advantage)" in titles
    at.selectbox(key="mx_layer").set_value(1)
    at.select_slider(key="mx_step").set_value(4)
    at.run()
    assert not at.exception
    assert "step 4" in " | ".join(json.loads(c.proto.spec)["layout"]["title"]["text"] for c in at.get("plotly_chart"))


def test_dyntool_figures_draws_from_an_hf_recorded_run(hf_root, tmp_path):
    import os
    import subprocess
    import sys
    out = tmp_path / "figs"
    env = {**os.environ, "PYTHONPATH": str(fixtures.REPO)}
    p = subprocess.run([sys.executable, "-m", "dyntool", "figures", str(hf_root), "--out", str(out),
                        "--format", "png"], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    # the user's model's own recorded quantities, not the LS paper's figures
    for name in ("recorded_attn", "recorded_compat", "recorded_advantage", "recorded_score_grad",
                 "recorded_head_stats"):
        assert (out / f"{name}.png").stat().st_size > 1000, name
        cap = (out / f"{name}.txt").read_text()
        assert "hf-gpt2" in cap and "non-finite" not in cap
    assert not (out / "ls_loss_logits.png").exists()


@pytest.mark.browser
def test_browser_renders_the_matrices_of_an_hf_recorded_run(hf_root, tmp_path):
    """The served app, in headless Chromium, draws α of the HF run (not only AppTest)."""
    from .test_app_browser import CHROMIUM, Browser, Server
    if CHROMIUM is None:
        pytest.skip("no Chromium binary (Debian: apt-get install -y chromium)")
    server, browser = Server(hf_root), None
    try:
        browser = Browser()
        browser.open(f"{server.url}/matrices?run=hf-gpt2", charts=1)
        text = browser.text()
        assert "Matrices" in text and "α (attention)" in text, text[:2000]
        assert "Traceback" not in text and "could not be drawn" not in text, text[:2000]
        browser.screenshot(tmp_path / "hf-matrices.png")
        assert (tmp_path / "hf-matrices.png").stat().st_size > 20_000
    finally:
        if browser is not None:
            browser.close()
        server.stop()


def test_pickers_name_the_model_heads_of_a_selection(tmp_path, monkeypatch):
    """A run that recorded ``heads="L1H1"`` stores one layer and one head; the Matrices pickers
    and titles say L1 H1 (the model's numbers), not the stored index 0."""
    torch.manual_seed(0)
    T = 8
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=len(fixtures.WORDS), n_positions=T, n_embd=16, n_layer=2, n_head=2,
        attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0, bos_token_id=0, eos_token_id=1))
    probe = torch.arange(T).view(1, T) % len(fixtures.WORDS)
    with RunRecorder(model, tmp_path, max_steps=2, every=1, name="sel", heads="L0H1,L1H*",
                     probe={"input_ids": probe, "labels": probe}) as rec:
        for step in range(2):
            rec.probe_step(step)
            rec.log(step, loss=1.0)
    at = _app(tmp_path, monkeypatch, "matrices", "sel")
    layer, head = at.selectbox(key="mx_layer"), at.selectbox(key="mx_head")
    assert layer.options == ["L0", "L1"]                       # AppTest lists the formatted options
    assert head.options[0] == "H1" and "(empty slot" in head.options[1]
    layer.set_value(1)
    at.run()
    head = at.selectbox(key="mx_head")
    assert head.options == ["H0", "H1"]
    titles = " | ".join(json.loads(c.proto.spec)["layout"]["title"]["text"] for c in at.get("plotly_chart"))
    assert "L1 H0" in titles, titles
    # the exported figure names each panel's own model head: L0 holds H1 only, L1 holds H0 and H1
    from dyntool.figures import FIGURES, render
    fig, _, _ = render(FIGURES["recorded_attn"], [dyntool.open_run(tmp_path / "sel")])
    shown = [(ax.get_ylabel() or None, ax.get_title()) for ax in fig.axes if ax.get_images()]
    assert [t.split(",")[0] for _, t in shown] == ["H1", "H1", "H0", "H1", "H0", "H1"], shown
