import torch
from torch import nn
torch.manual_seed(0)
m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.SGD(m.parameters(), lr=0.1)
torch.manual_seed(1)
X = torch.randn(8, 8); Y = torch.randn(8, 1)
for step in range(3):
    loss = ((m(X) - Y) ** 2).mean(); opt.zero_grad(); loss.backward(); opt.step()
print(f"ref w {m[0].weight.sum().item():.6f}")
