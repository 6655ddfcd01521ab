"""tinytune.nn's state dicts and safetensors files, the IDX and digits datasets, and the DataLoader; on the default device, no downloads."""
from __future__ import annotations

import gzip
import os
import struct
from collections import namedtuple
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tinytune import Tensor, dtypes
from tinytune.nn import DataLoader, datasets
from tinytune.nn.state import get_parameters, get_state_dict, load_state_dict, safe_load, safe_save
from tinytune.runtime import Device

# ***** state dicts *****


class Linear:
  def __init__(self, fan_in: int, fan_out: int):
    self.weight, self.bias = Tensor(np.random.rand(fan_out, fan_in).astype(np.float32)), Tensor(np.zeros(fan_out, np.float32))


class Model:
  def __init__(self) -> None:
    self.l1, self.layers = Linear(4, 3), [Linear(3, 3), Linear(3, 2)]
    self.norms = {"pre": Tensor(np.ones(4, np.float32)), "post": (Tensor(np.ones(2, np.float16)),)}
    self.name, self.act, self.parent = "mlp", np.tanh, self  # not tensors, and a cycle back to itself


def test_state_dict_names() -> None:
  m = Model()
  sd = get_state_dict(m)
  assert list(sd) == ["l1.weight", "l1.bias", "layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias", "norms.pre", "norms.post.0"]
  assert sd["layers.1.weight"] is m.layers[1].weight and sd["norms.post.0"] is m.norms["post"][0]
  assert list(get_state_dict(m.l1, prefix="enc.")) == ["enc.weight", "enc.bias"]
  assert list(get_state_dict(namedtuple("Pair", "a b")(Tensor([1]), [Tensor([2])]))) == ["a", "b.0"]


def test_parameters_once_each() -> None:
  m = Model()
  m.tied = m.l1  # one layer under two names: twice in the state dict, once in the parameters
  assert len(get_state_dict(m)) == 10 and "tied.weight" in get_state_dict(m)
  params = get_parameters(m)
  assert len(params) == 8 and params[0] is m.l1.weight


def test_load_state_dict_round_trip() -> None:
  src, dst = Model(), Model()
  dst.layers[0].weight = dst.layers[0].weight + 1  # a lazy tensor is loaded in place too
  sd = get_state_dict(src)
  sd["l1.bias"] = np.arange(3)  # numpy values and other dtypes come in as the model tensor's dtype
  w = dst.l1.weight
  load_state_dict(dst, sd)
  assert dst.l1.weight is w and w.device == Device.DEFAULT and dst.l1.bias.dtype == dtypes.float32
  np.testing.assert_array_equal(dst.l1.bias.numpy(), [0, 1, 2])
  for k, v in get_state_dict(dst).items():
    if k != "l1.bias": np.testing.assert_array_equal(v.numpy(), sd[k].numpy())
  assert dst.norms["post"][0].dtype == dtypes.float16


def test_load_state_dict_strict() -> None:
  m = Model()
  sd = {k: v.numpy() for k, v in get_state_dict(m).items()}
  sd["extra.weight"] = np.zeros(2)
  del sd["layers.1.bias"]
  before = m.l1.weight.numpy()
  with pytest.raises(ValueError, match=r"1 missing \(layers.1.bias\); 1 unexpected \(extra.weight\)"): load_state_dict(m, sd)
  sd["l1.weight"] = before + 1
  load_state_dict(m, sd, strict=False)
  np.testing.assert_array_equal(m.l1.weight.numpy(), before + 1)


def test_load_state_dict_shapes() -> None:
  m = Model()
  sd = get_state_dict(Model())
  sd["l1.weight"], sd["l1.bias"] = Tensor(np.ones((4, 3), np.float32)), Tensor(np.ones(3, np.float32))
  sd["layers.0.bias"] = Tensor(np.ones(4, np.float32))
  before = m.l1.bias.numpy()
  with pytest.raises(ValueError, match=r"l1.weight: model \(3, 4\), state dict \(4, 3\); layers.0.bias: model \(3,\), state dict \(4,\)"):
    load_state_dict(m, sd, strict=False)  # shapes are checked even when not strict
  np.testing.assert_array_equal(m.l1.bias.numpy(), before)  # and nothing was loaded


# ***** safetensors *****


def _tensors() -> dict[str, Tensor]:
  return {"w": Tensor(np.random.randn(3, 5).astype(np.float32)), "half": Tensor(np.random.randn(4).astype(np.float16)),
          "bf": Tensor(np.array([1.5, -2.25, 3e38, 0.1], dtypes.bfloat16.np)), "ids": Tensor(np.array([[1, -2]], np.int64)),
          "mask": Tensor(np.array([True, False])), "pix": Tensor(np.arange(6, dtype=np.uint8).reshape(2, 3)), "n": Tensor(np.int32(7))}


def test_safetensors_round_trip(tmp_path: Path) -> None:
  sd = _tensors()
  safe_save(sd, tmp_path / "m.safetensors", metadata={"epoch": "3"})
  assert os.listdir(tmp_path) == ["m.safetensors"]  # no temporary file left behind
  back = safe_load(tmp_path / "m.safetensors")
  assert set(back) == set(sd)
  for k, t in sd.items():
    assert back[k].dtype == t.dtype and back[k].shape == t.shape, k
    np.testing.assert_array_equal(back[k].numpy(), t.numpy())
  m, m2 = Model(), Model()
  safe_save(get_state_dict(m), tmp_path / "model.safetensors")
  load_state_dict(m2, safe_load(tmp_path / "model.safetensors"))
  np.testing.assert_array_equal(m2.layers[1].weight.numpy(), m.layers[1].weight.numpy())


def test_safetensors_bad(tmp_path: Path) -> None:
  (tmp_path / "bad.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
  with pytest.raises(ValueError, match="is not a safetensors file"): safe_load(tmp_path / "bad.safetensors")
  with pytest.raises(TypeError, match="metadata is a dict of str to str"): safe_save(_tensors(), tmp_path / "x.safetensors", metadata={"epoch": 3})  # type: ignore
  (tmp_path / "keep.safetensors").write_bytes(b"old")
  with pytest.raises(Exception): safe_save({"x": np.zeros(2, np.complex128)}, tmp_path / "keep.safetensors")  # a failed write keeps the old file
  assert (tmp_path / "keep.safetensors").read_bytes() == b"old" and sorted(os.listdir(tmp_path)) == ["bad.safetensors", "keep.safetensors"]


def test_safetensors_with_torch(tmp_path: Path) -> None:
  torch = pytest.importorskip("torch", reason="torch is not installed: the round trip with safetensors.torch needs it")
  from safetensors.torch import load_file, save_file
  sd = _tensors()
  safe_save(sd, tmp_path / "ours.safetensors")
  theirs = load_file(tmp_path / "ours.safetensors")
  assert theirs["bf"].dtype == torch.bfloat16 and theirs["ids"].dtype == torch.int64 and theirs["mask"].dtype == torch.bool
  for k, t in sd.items(): np.testing.assert_array_equal(theirs[k].float().numpy(), t.numpy().astype(np.float32), err_msg=k)
  save_file({"bf": torch.tensor([[0.5, -7.0]], dtype=torch.bfloat16), "f": torch.arange(6.0).reshape(2, 3), "u": torch.arange(3, dtype=torch.uint8)},
            tmp_path / "theirs.safetensors")
  ours = safe_load(tmp_path / "theirs.safetensors")
  assert ours["bf"].dtype == dtypes.bfloat16 and ours["f"].dtype == dtypes.float32 and ours["u"].dtype == dtypes.uint8
  np.testing.assert_array_equal(ours["bf"].numpy().astype(np.float32), [[0.5, -7.0]])
  np.testing.assert_array_equal(ours["f"].numpy(), np.arange(6.0).reshape(2, 3))


# ***** datasets *****


def write_idx(path: Path, arr: np.ndarray, code: int = 0x08, header: bytes | None = None) -> Path:
  data = (header if header is not None else struct.pack(">BBBB", 0, 0, code, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)) + arr.tobytes()
  path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
  return path


def write_mnist(folder: Path, n_train: int = 5, n_test: int = 3, gz: bool = True) -> list[np.ndarray]:
  arrays = [np.random.randint(0, 256, (n_train, 28, 28), np.uint8), np.random.randint(0, 10, n_train, np.uint8),
            np.random.randint(0, 256, (n_test, 28, 28), np.uint8), np.random.randint(0, 10, n_test, np.uint8)]
  for i, (name, arr) in enumerate(zip(datasets.MNIST_FILES, arrays)): write_idx(folder / (name + (".gz" if gz and i % 2 == 0 else "")), arr)
  return arrays


@pytest.mark.parametrize("fashion", [False, True])
def test_mnist(tmp_path: Path, fashion: bool) -> None:
  arrays = write_mnist(tmp_path)  # images gzipped, labels raw
  got = datasets.mnist(fashion=fashion, path=tmp_path)
  assert [t.shape for t in got] == [(5, 1, 28, 28), (5,), (3, 1, 28, 28), (3,)] and all(t.dtype == dtypes.uint8 for t in got)
  for t, arr in zip(got, arrays): np.testing.assert_array_equal(t.numpy().reshape(arr.shape), arr)


def test_mnist_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
  write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(2, np.uint8))
  with pytest.raises(FileNotFoundError, match=f"MNIST files missing: put train-images-idx3-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte "
                                              rf"\(gzipped as .gz or not\) in {tmp_path}, or pass path="):
    datasets.mnist(path=tmp_path)
  monkeypatch.setenv("HOME", str(tmp_path))
  with pytest.raises(FileNotFoundError, match=f"Fashion-MNIST files missing: .* in {tmp_path}/.cache/tinytune/fashion-mnist"):
    datasets.mnist(fashion=True)


def test_read_idx(tmp_path: Path) -> None:
  arr = (np.arange(24).reshape(2, 3, 4) - 5).astype(">i4")  # IDX is big-endian
  np.testing.assert_array_equal(datasets.read_idx(write_idx(tmp_path / "a.gz", arr, 0x0C)), arr)
  np.testing.assert_array_equal(datasets.read_idx(write_idx(tmp_path / "b", arr.astype(">f4"), 0x0D)), arr)


@pytest.mark.parametrize("data,error", [
  (b"", "not an IDX file .* magic number is missing"),
  (b"\x00\x01\x08\x01" + b"\x00" * 8, "not an IDX file .* magic number is 00010801"),
  (b"\x00\x00\x07\x01" + b"\x00" * 8, "not an IDX file"),  # no such type code
  (b"\x00\x00\x08\x03\x00\x00\x00\x02", r"truncated IDX header \(8 bytes for 3 dims\)"),
  (b"\x00\x00\x08\x01\x00\x00\x00\x05abc", r"truncated: 11 bytes where an IDX array of shape \(5,\) takes 13"),
  (b"\x00\x00\x08\x01\x00\x00\x00\x02abc", "trailing bytes: 11 bytes"),
])
def test_read_idx_bad(tmp_path: Path, data: bytes, error: str) -> None:
  (tmp_path / "f").write_bytes(data)
  with pytest.raises(ValueError, match=error): datasets.read_idx(tmp_path / "f")


def test_mnist_bad_files(tmp_path: Path) -> None:
  write_mnist(tmp_path, gz=False)
  os.remove(tmp_path / "t10k-images-idx3-ubyte")
  (tmp_path / "t10k-images-idx3-ubyte.gz").write_bytes(gzip.compress(np.random.bytes(1000))[:500])  # a truncated download
  with pytest.raises(ValueError, match="t10k-images-idx3-ubyte.gz: not a whole gzip file"): datasets.mnist(path=tmp_path)
  write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", np.zeros((3, 28, 28), np.uint8))
  write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(4, np.uint8))
  with pytest.raises(ValueError, match="has 5 images but .*train-labels-idx1-ubyte 4 labels"): datasets.mnist(path=tmp_path)
  write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros((5, 28, 28), np.uint8))
  with pytest.raises(ValueError, match=r"holds a uint8 array of shape \(5, 28, 28\), not the uint8 \(N,\) labels"): datasets.mnist(path=tmp_path)


def test_digits() -> None:
  pytest.importorskip("sklearn", reason='scikit-learn is not installed: pip install "tinytune[data]"')
  x_train, y_train, x_test, y_test = datasets.digits()
  assert x_train.shape == (1437, 1, 8, 8) and x_test.shape == (360, 1, 8, 8) and y_train.shape == (1437,) and y_test.shape == (360,)
  assert x_train.dtype == dtypes.float32 and y_train.dtype == dtypes.uint8
  x = x_train.numpy()
  assert x.min() == 0 and x.max() == 1 and set(np.unique(y_test.numpy())) == set(range(10))
  again = datasets.digits()
  np.testing.assert_array_equal(again[1].numpy(), y_train.numpy())  # the same split every call
  from sklearn.datasets import load_digits
  everything = np.concatenate([x, x_test.numpy()]).reshape(-1, 64) * 16
  assert sorted(map(bytes, everything.astype(np.uint8))) == sorted(map(bytes, load_digits().data.astype(np.uint8)))


def test_digits_without_sklearn(monkeypatch: pytest.MonkeyPatch) -> None:
  import sys
  monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
  with pytest.raises(ImportError, match=r'digits\(\) needs scikit-learn: pip install "tinytune\[data\]"'): datasets.digits()


# ***** DataLoader *****


def _epoch(loader: DataLoader) -> list[tuple[np.ndarray, ...]]: return [tuple(t.numpy() for t in batch) for batch in loader]


@pytest.mark.parametrize("n,batch_size,drop_last", [(10, 3, False), (10, 3, True), (12, 4, False), (2, 5, False), (2, 5, True)])
def test_loader_covers_each_sample_once(n: int, batch_size: int, drop_last: bool) -> None:
  x, y = np.arange(n * 2, dtype=np.float32).reshape(n, 2), np.arange(n)
  loader = DataLoader(x, Tensor(y), batch_size=batch_size, drop_last=drop_last, seed=1)
  assert len(loader) == (n // batch_size if drop_last else -(-n // batch_size))
  for _ in range(3):
    batches = _epoch(loader)
    assert len(batches) == len(loader)
    assert [len(b[1]) for b in batches] == [batch_size] * (n // batch_size) + ([n % batch_size] if n % batch_size and not drop_last else [])
    seen = np.concatenate([b[1] for b in batches]) if batches else np.zeros(0)
    assert len(set(seen.tolist())) == len(seen) == (n // batch_size * batch_size if drop_last else n)  # each once, all unless drop_last
    for bx, by in batches: np.testing.assert_array_equal(bx, x[by])  # the rows of every array stay together


def test_loader_order() -> None:
  y = np.arange(100, dtype=np.int32)
  def order(loader: DataLoader) -> list[int]: return np.concatenate([b[0] for b in _epoch(loader)]).tolist()
  seeded = DataLoader(y, batch_size=16, seed=7)
  epochs = [order(seeded) for _ in range(3)]
  assert epochs[0] != epochs[1] != epochs[2] and all(sorted(e) == y.tolist() for e in epochs)  # a fresh permutation each epoch
  again = DataLoader(y, batch_size=16, seed=7)
  assert [order(again) for _ in range(3)] == epochs  # and the same ones from the same seed
  assert order(DataLoader(y, batch_size=16, seed=8)) != epochs[0]
  assert order(DataLoader(y, batch_size=16, shuffle=False)) == y.tolist()


def test_loader_batches() -> None:
  x, y = np.random.rand(9, 1, 4, 4).astype(np.float32), np.arange(9, dtype=np.uint8)
  batches = list(DataLoader(x, y, batch_size=4, seed=0))
  assert [tuple(t.shape for t in b) for b in batches] == [((4, 1, 4, 4), (4,)), ((4, 1, 4, 4), (4,)), ((1, 1, 4, 4), (1,))]
  assert all(b[0].dtype == dtypes.float32 and b[1].dtype == dtypes.uint8 and b[0].device == Device.DEFAULT for b in batches)
  first = batches[0][0].numpy()
  list(DataLoader(x, y, batch_size=4, seed=0))
  np.testing.assert_array_equal(batches[0][0].numpy(), first)  # a batch holds its own copy, not the loader's reused array
  assert repr(DataLoader(x, batch_size=4)) == "<DataLoader 9 samples in 3 batches of 4, shuffled>"


@pytest.mark.parametrize("args,kwargs,error", [
  ((), {"batch_size": 2}, "at least one array"),
  ((np.zeros(3),), {"batch_size": 0}, "batch_size is a positive int"),
  ((np.zeros(3), np.zeros(4)), {"batch_size": 2}, r"differ in length: \[3, 4\]"),
  ((np.float32(1),), {"batch_size": 2}, "0-d"),
])
def test_loader_bad(args: tuple, kwargs: dict[str, Any], error: str) -> None:
  with pytest.raises(ValueError, match=error): DataLoader(*args, **kwargs)


def test_loader_in_jit() -> None:
  from tinytune import TinyJit
  x, y = np.random.rand(50, 6).astype(np.float32), np.arange(50, dtype=np.int32)
  step = TinyJit(lambda bx, by: ((bx.sum(axis=1) + by.cast(dtypes.float32)) * 1).realize())
  for bx, by in DataLoader(x, y, batch_size=8, drop_last=True, seed=0):  # fixed shapes: replays after two calls
    np.testing.assert_allclose(step(bx, by).numpy(), x[by.numpy()].sum(axis=1) + by.numpy(), rtol=1e-6)
  assert step.captured is not None
