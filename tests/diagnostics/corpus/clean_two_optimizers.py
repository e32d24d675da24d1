"""Clean: two optimizers (SGD for the body, Adam for the head), each watched with its own part
of the model, each cleared every step. Two runs, both clean."""

import torch

import gradwatch

EXPECTED_CODES: set[str] = set()

torch.manual_seed(6)
data = torch.randn(512, 8)
target = data[:, :1] * 2 - data[:, 1:2]
body = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU())
head = torch.nn.Linear(16, 1)
opt_body = torch.optim.SGD(body.parameters(), lr=0.05)
opt_head = torch.optim.Adam(head.parameters(), lr=1e-2)
watchers = [
    gradwatch.watch(opt_body, model=body, run="clean_two_optimizers-body", project="corpus"),
    gradwatch.watch(opt_head, model=head, run="clean_two_optimizers-head", project="corpus"),
]
for step in range(30):
    idx = torch.randint(0, 512, (32,))
    opt_body.zero_grad()
    opt_head.zero_grad()
    loss = torch.nn.functional.mse_loss(head(body(data[idx])), target[idx])
    loss.backward()
    opt_body.step()
    opt_head.step()
for w in watchers:
    w.close(timeout=30)
    print("gradwatch run:", w.run_id)
