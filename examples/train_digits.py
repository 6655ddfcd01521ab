"""Train an MLP on scikit-learn's 8x8 digits (bundled, no download) with Adam under TinyJit, with a progress bar of loss and it/s.

  python examples/train_digits.py [--epochs 30] [--batch 64] [--device CPU]
  python examples/train_digits.py --fashion [--path DIR]   # Fashion-MNIST from its IDX files, when they are in DIR

Needs `pip install "tinytune[data]"` (scikit-learn) for the digits."""
from __future__ import annotations

import argparse
import time

from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from tinytune import Tensor, TinyJit, dtypes, nn
from tinytune.nn import optim


class MLP:
  def __init__(self, inputs: int, hidden: int, classes: int):
    self.l1, self.l2 = nn.Linear(inputs, hidden), nn.Linear(hidden, classes)

  def __call__(self, x: Tensor) -> Tensor: return self.l2(self.l1(x.flatten(1)).relu())


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--epochs", type=int, default=30)
  ap.add_argument("--batch", type=int, default=64)
  ap.add_argument("--lr", type=float, default=3e-3)
  ap.add_argument("--device", default=None)
  ap.add_argument("--fashion", action="store_true", help="Fashion-MNIST (28x28) from local IDX files instead of the digits")
  ap.add_argument("--path", default=None, help="the folder of the Fashion-MNIST IDX files")
  args = ap.parse_args()

  if args.fashion:
    X_train, Y_train, X_test, Y_test = nn.datasets.mnist(fashion=True, path=args.path, device=args.device)
    X_train, X_test = X_train.cast(dtypes.float32) / 255, X_test.cast(dtypes.float32) / 255
  else: X_train, Y_train, X_test, Y_test = nn.datasets.digits(device=args.device)
  Tensor.manual_seed(0)
  model = MLP(X_train[0].numel(), 128, 10)
  opt = optim.Adam(nn.state.get_parameters(model), lr=args.lr)

  @TinyJit
  @Tensor.train()
  def step(x: Tensor, y: Tensor) -> Tensor:
    opt.zero_grad()
    loss = model(x).sparse_categorical_crossentropy(y)
    loss.backward()
    return loss.realize(*opt.schedule_step())

  loader = nn.DataLoader(X_train, Y_train, batch_size=args.batch, drop_last=True, seed=0)
  columns = [TextColumn("epoch {task.fields[epoch]:>3}"), BarColumn(), TextColumn("loss {task.fields[loss]:.4f}"),
             TextColumn("{task.fields[rate]:>7.0f} it/s"), TimeRemainingColumn()]
  with Progress(*columns) as progress:
    task = progress.add_task("train", total=args.epochs * len(loader), epoch=0, loss=float("nan"), rate=0.0)
    st, steps = time.perf_counter(), 0
    for epoch in range(args.epochs):
      for x, y in loader:
        loss = step(x, y)
        steps += 1
        if steps % 20 == 0: progress.update(task, advance=20, epoch=epoch + 1, loss=loss.item(), rate=steps / (time.perf_counter() - st))
  accuracy = (model(X_test).argmax(-1) == Y_test.cast(dtypes.int32)).mean().item()
  print(f"{steps} steps in {time.perf_counter() - st:.1f} s; held-out accuracy {accuracy:.1%}")


if __name__ == "__main__":
  main()
