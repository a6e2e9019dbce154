"""A numpy reader and writer of safetensors files, for the float64 references in tools/ (no safetensors or torch
package needed): single files and sharded folders (model.safetensors.index.json), F64/F32/F16/BF16/I64/I32/I16/I8/U8/
BOOL, tensors read lazily and checked against the file's size; bf16 rounding for the references' bf16 emulation."""
import json
import os
import struct

import numpy as np

# ----------------------------------------------------------------------------------------------------------------
# safetensors (same reader/writer as tools/motif_reference.py)
# ----------------------------------------------------------------------------------------------------------------
_ST_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
              "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_, "BF16": np.uint16}


class SafetensorsFile:
    """Lazy reader: header parsed at open, tensor bytes read on demand."""

    def __init__(self, path):
        self.path = path
        with open(path, "rb") as f:
            (hlen,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(hlen).decode("utf-8"))
        self.data_start = 8 + hlen
        self.metadata = header.pop("__metadata__", {}) or {}
        self.entries = header
        size = os.path.getsize(path)
        for name, e in header.items():
            b, en = e["data_offsets"]
            if e["dtype"] not in _ST_DTYPES:
                raise ValueError(f"{path}: {name}: unsupported dtype {e['dtype']}")
            n = int(np.prod(e["shape"], dtype=np.int64)) if e["shape"] else 1
            if en - b != n * np.dtype(_ST_DTYPES[e["dtype"]]).itemsize or self.data_start + en > size:
                raise ValueError(f"{path}: {name}: bad data_offsets {e['data_offsets']}")

    def keys(self):
        return list(self.entries.keys())

    def dtype(self, name):
        return self.entries[name]["dtype"]

    def raw(self, name):
        e = self.entries[name]
        b, en = e["data_offsets"]
        with open(self.path, "rb") as f:
            f.seek(self.data_start + b)
            buf = f.read(en - b)
        a = np.frombuffer(buf, dtype=np.dtype(_ST_DTYPES[e["dtype"]]).newbyteorder("<"))
        return a.reshape(e["shape"])

    def get(self, name, dtype=np.float64):
        """The tensor converted exactly to `dtype` (bf16 is widened bit-exactly)."""
        a = self.raw(name)
        if self.dtype(name) == "BF16":
            a = (a.astype(np.uint32) << 16).view(np.float32)
        return a.astype(dtype)


def bf16_round(a):
    """float -> nearest-even bfloat16, returned as float32 values (exactly representable in bf16)."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    u = a.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint32) << 16
    r = np.where(np.isnan(a), np.uint32(0x7FC00000), r.astype(np.uint32))
    return r.view(np.float32).reshape(a.shape)


class BF16:
    """Marks an array to be stored as BF16 by write_safetensors (values rounded to nearest-even)."""

    def __init__(self, a):
        self.a = np.asarray(a)


def write_safetensors(path, tensors, metadata=None):
    """tensors: name -> np.ndarray (F64/F32/F16/I64/I32/...) or BF16(array), written in the given order."""
    names = {np.dtype(v): k for k, v in _ST_DTYPES.items() if k != "BF16"}
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, t in tensors.items():
        if isinstance(t, BF16):
            arr = np.ascontiguousarray(bf16_round(t.a)).view(np.uint32)
            data = (arr >> 16).astype("<u2").tobytes()
            dt, shape = "BF16", list(t.a.shape)
        else:
            arr = np.ascontiguousarray(t)
            dt = names[arr.dtype]
            data = arr.astype(arr.dtype.newbyteorder("<")).tobytes()
            shape = list(arr.shape)
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


class Checkpoint:
    """All tensors of a HF folder: model.safetensors, or the shards named by model.safetensors.index.json."""

    def __init__(self, folder):
        self.folder = folder
        index = os.path.join(folder, "model.safetensors.index.json")
        self.where = {}
        if os.path.exists(index):
            with open(index) as f:
                wm = json.load(f)["weight_map"]
            files = {}
            for name, fn in wm.items():
                if fn not in files:
                    files[fn] = SafetensorsFile(os.path.join(folder, fn))
                if name not in files[fn].entries:
                    raise ValueError(f"index names {name} in {fn}, which does not hold it")
                self.where[name] = files[fn]
        elif os.path.exists(os.path.join(folder, "model.safetensors")):
            sf = SafetensorsFile(os.path.join(folder, "model.safetensors"))
            self.where = {k: sf for k in sf.keys()}
        else:
            raise FileNotFoundError(f"{folder}: no model.safetensors nor model.safetensors.index.json")
        self._cache = {}

    def __contains__(self, name):
        return name in self.where

    def get(self, name):
        if name not in self.where:
            raise KeyError(f"{self.folder}: tensor {name} missing")
        if name not in self._cache:
            self._cache[name] = self.where[name].get(name)
        return self._cache[name]

    def opt(self, name):
        return self.get(name) if name in self.where else None
