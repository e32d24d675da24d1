"""The incident view of an instability finding (frontend/js/views/findings.js): a real training
loop logs its loss and gets one corrupted batch; its `loss_spike` finding opens a view that ranks
the parameters that moved first, gives the loss, and zooms every chart to the steps around it."""

from __future__ import annotations

import torch
from playwright.sync_api import expect

import gradwatch
from support.browser import Page
from support.server import ServerProcess


def test_a_loss_spike_opens_an_incident_view_that_zooms_to_it(dash: ServerProcess, page: Page) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    w = gradwatch.watch(opt, model=model, run="incident", project="incidents", server=dash.url, warn=False)
    target = torch.randn(4, 1)
    for step in range(1, 71):
        x = torch.randn(32, 4)
        y = x @ target + (30.0 if step == 60 else 0.0)  # the corrupted batch: labels off by 30
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        w.log(loss=loss)
        opt.step()
    w.close(timeout=30)
    p = page.open(f"{dash.url}/runs/{w.run_id}")
    row = p.locator('.findings .finding[data-code="loss_spike"]')
    view = row.locator("details.incident")
    expect(view).to_have_attribute("data-step", "60")
    view.locator("summary").click()
    expect(view.locator(".incident-loss")).to_contain_text("at step 60")
    first = view.locator(".incident-params tbody tr").first
    expect(first.locator(".incident-lead")).to_have_text("same step")  # the batch moved them at once
    moved = first.get_attribute("data-param")
    assert moved in {n for n, _ in model.named_parameters()}
    view.locator("button.incident-zoom").click()
    expect(p.locator("body")).to_have_attribute("data-zoom", "36-68")
    expect(p.locator(f'.chip[data-param="{moved}"], .chip:has-text("{moved}")').first).to_be_visible()
