"""A small WebAssembly assembler: flat WAT function bodies -> a side module that Pyodide loads with ctypes.

Pyodide's numpy has no BLAS, and its main module does not hand its memory to JavaScript. A wasm
*side module* (the kind of ``.so`` Pyodide's packages ship) imports the main module's memory, so a
kernel written here reads and writes numpy's buffers in place, and ``ctypes.CDLL`` loads it like any
shared library. This module turns text in WAT's flat instruction syntax (one instruction per line,
named locals and labels, ``;;`` comments) into that binary: a ``dylink.0`` section, the imported
``env.memory``, and the exported functions. It covers the instructions our kernels use, nothing more;
an unknown instruction is an error, not a guess. Standard library only.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

VALTYPES = {"i32": 0x7F, "i64": 0x7E, "f32": 0x7D, "f64": 0x7C, "v128": 0x7B}

# Instructions without immediates.
PLAIN = {
    "return": b"\x0f", "drop": b"\x1a", "select": b"\x1b",
    "i32.eqz": b"\x45", "i32.eq": b"\x46", "i32.ne": b"\x47", "i32.lt_s": b"\x48", "i32.lt_u": b"\x49",
    "i32.gt_s": b"\x4a", "i32.gt_u": b"\x4b", "i32.le_s": b"\x4c", "i32.le_u": b"\x4d", "i32.ge_s": b"\x4e",
    "i32.ge_u": b"\x4f", "i32.add": b"\x6a", "i32.sub": b"\x6b", "i32.mul": b"\x6c", "i32.and": b"\x71",
    "i32.or": b"\x72", "i32.shl": b"\x74", "i32.shr_u": b"\x76",
    "f32.add": b"\x92", "f32.sub": b"\x93", "f32.mul": b"\x94",
}
SIMD_PLAIN = {"f32x4.splat": 0x13, "f32x4.add": 0xE4, "f32x4.sub": 0xE5, "f32x4.mul": 0xE6}
# name -> (opcode bytes, natural alignment as log2 of bytes)
MEMORY = {
    "f32.load": (b"\x2a", 2), "f32.store": (b"\x38", 2), "i32.load": (b"\x28", 2), "i32.store": (b"\x36", 2),
    "v128.load": (b"\xfd" + bytes([0x00]), 4), "v128.store": (b"\xfd" + bytes([0x0B]), 4),
    "v128.load32_splat": (b"\xfd" + bytes([0x09]), 2),
}
LOCALS = {"local.get": b"\x20", "local.set": b"\x21", "local.tee": b"\x22"}
BRANCHES = {"br": b"\x0c", "br_if": b"\x0d"}
BLOCKS = {"block": b"\x02", "loop": b"\x03"}


class WasmError(ValueError):
    """Text the assembler cannot turn into a valid module; the message names the line."""


def uleb(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def sleb(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        done = (value == 0 and not byte & 0x40) or (value == -1 and byte & 0x40)
        out.append(byte | (0 if done else 0x80))
        if done:
            return bytes(out)


def _name(text: str) -> bytes:
    raw = text.encode()
    return uleb(len(raw)) + raw


def _vector(items: list[bytes]) -> bytes:
    return uleb(len(items)) + b"".join(items)


def _section(section_id: int, payload: bytes) -> bytes:
    return bytes([section_id]) + uleb(len(payload)) + payload


@dataclass
class Function:
    """One exported function: ``params`` and ``locals`` are (name, type) pairs, ``body`` flat WAT text."""

    name: str
    params: list[tuple[str, str]]
    body: str
    locals: list[tuple[str, str]] = field(default_factory=list)
    results: list[str] = field(default_factory=list)

    def signature(self) -> bytes:
        params = bytes(VALTYPES[kind] for _, kind in self.params)
        results = bytes(VALTYPES[kind] for kind in self.results)
        return b"\x60" + uleb(len(params)) + params + uleb(len(results)) + results

    def code(self) -> bytes:
        names = [name for name, _ in self.params + self.locals]
        if len(set(names)) != len(names):
            raise WasmError(f"{self.name}: a parameter or local is declared twice")
        index = {name: i for i, name in enumerate(names)}
        groups: list[bytes] = [uleb(1) + bytes([VALTYPES[kind]]) for _, kind in self.locals]
        body = _assemble(self.name, self.body, index)
        payload = _vector(groups) + body + b"\x0b"
        return uleb(len(payload)) + payload


def _memarg(where: str, natural: int, args: list[str]) -> bytes:
    offset, align = 0, natural
    for arg in args:
        key, _, value = arg.partition("=")
        if key == "offset" and value.isdigit():
            offset = int(value)
        elif key == "align" and value.isdigit() and int(value) and not int(value) & (int(value) - 1):
            align = int(value).bit_length() - 1
        else:
            raise WasmError(f"{where}: bad memory argument {arg!r}")
    if align > natural:
        raise WasmError(f"{where}: alignment above the natural one")
    return uleb(align) + uleb(offset)


def _assemble(function: str, text: str, index: dict[str, int]) -> bytes:
    out = bytearray()
    labels: list[str | None] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split(";;", 1)[0].strip()
        if not line:
            continue
        where = f"{function}, line {number} ({line!r})"
        op, *args = line.split()
        if op in PLAIN and not args:
            out += PLAIN[op]
        elif op in SIMD_PLAIN and not args:
            out += b"\xfd" + uleb(SIMD_PLAIN[op])
        elif op in MEMORY:
            code, natural = MEMORY[op]
            out += code + _memarg(where, natural, args)
        elif op in LOCALS and len(args) == 1 and args[0][:1] == "$" and args[0][1:] in index:
            out += LOCALS[op] + uleb(index[args[0][1:]])
        elif op == "i32.const" and len(args) == 1:
            out += b"\x41" + sleb(int(args[0], 0))
        elif op == "f32.const" and len(args) == 1:
            out += b"\x43" + struct.pack("<f", float(args[0]))
        elif op == "v128.const" and args[:1] == ["i32x4"] and len(args) == 5:
            out += b"\xfd" + uleb(0x0C) + struct.pack("<4I", *(int(a, 0) & 0xFFFFFFFF for a in args[1:]))
        elif op in BLOCKS and len(args) <= 1:
            labels.append(args[0] if args else None)
            out += BLOCKS[op] + b"\x40"
        elif op == "end" and not args:
            if not labels:
                raise WasmError(f"{where}: 'end' without a block")
            labels.pop()
            out += b"\x0b"
        elif op in BRANCHES and len(args) == 1:
            if args[0] not in labels:
                raise WasmError(f"{where}: no enclosing block or loop named {args[0]}")
            depth = len(labels) - 1 - max(i for i, label in enumerate(labels) if label == args[0])
            out += BRANCHES[op] + uleb(depth)
        else:
            raise WasmError(f"{where}: not an instruction this assembler knows (or bad arguments)")
    if labels:
        raise WasmError(f"{function}: {len(labels)} block(s) left open")
    return bytes(out)


def side_module(functions: list[Function]) -> bytes:
    """A wasm side module exporting ``functions``; it has no data or table and imports only ``env.memory``."""
    # dylink.0 with one WASM_DYLINK_MEM_INFO subsection: no memory, no table of its own.
    mem_info = uleb(0) + uleb(0) + uleb(0) + uleb(0)
    dylink = _section(0, _name("dylink.0") + bytes([1]) + uleb(len(mem_info)) + mem_info)
    types = _section(1, _vector([f.signature() for f in functions]))
    memory = _section(2, _vector([_name("env") + _name("memory") + b"\x02" + b"\x00" + uleb(0)]))
    declared = _section(3, _vector([uleb(i) for i in range(len(functions))]))
    exports = _section(7, _vector([_name(f.name) + b"\x00" + uleb(i) for i, f in enumerate(functions)]))
    code = _section(10, _vector([f.code() for f in functions]))
    return b"\x00asm" + struct.pack("<I", 1) + dylink + types + memory + declared + exports + code
