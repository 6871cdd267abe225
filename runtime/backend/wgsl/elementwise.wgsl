// Strided elementwise map out = f(a, b, c) over up to 6 dimensions. Broadcasting, permuted and sliced views
// are expressed as strides (0 for a broadcast axis), so views never need a copy before an elementwise op.
// Params: [0] n, [1] op, [2] ndim, [3..8] shape; operand k (0 a, 1 b, 2 c, 3 out) at 16 + 8k:
// 6 strides, offset, is-scalar flag; scalar values at [48..50].
@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> a: array<f32>;
@group(0) @binding(3) var<storage, read> b: array<f32>;
@group(0) @binding(4) var<storage, read> c: array<f32>;

const GELU_C: f32 = 0.7978845608028654;  // sqrt(2 / pi)
const GELU_A: f32 = 0.044715;

fn element_offset(i: u32, k: u32) -> u32 {
  let base = 16u + 8u * k;
  let ndim = p[2];
  var rest = i;
  var offset = p[base + 6u];
  for (var d = 0u; d < ndim; d = d + 1u) {
    let axis = ndim - 1u - d;
    let size = p[3u + axis];
    offset = offset + (rest % size) * p[base + axis];
    rest = rest / size;
  }
  return offset;
}

fn signed_pow(x: f32, y: f32) -> f32 {
  if (y == 2.0) { return x * x; }
  if (y == 1.0) { return x; }
  if (y == 0.0) { return 1.0; }
  if (x < 0.0 && y == round(y)) {
    let magnitude = pow(-x, y);
    if (abs(y % 2.0) == 1.0) { return -magnitude; }
    return magnitude;
  }
  return pow(x, y);
}

fn apply(op: u32, x: f32, y: f32, z: f32) -> f32 {
  switch op {
    case 0u: { return -x; }
    case 1u: { return exp(x); }
    case 2u: { return log(x); }
    case 3u: { return stable_tanh(x); }
    case 4u: { return max(x, 0.0); }
    case 5u: { return sqrt(x); }
    case 6u: { return abs(x); }
    case 7u: { return sign(x); }
    case 8u: { return select(0.0, 1.0, x > 0.0); }
    case 9u: { return x; }
    case 10u: { return x + y; }
    case 11u: { return x - y; }
    case 12u: { return x * y; }
    case 13u: { return x / y; }
    case 14u: { return signed_pow(x, y); }
    case 15u: { return max(x, y); }
    case 20u: { return select(0.0, 1.0, x == y); }
    case 21u: { return select(0.0, 1.0, x > y); }
    case 22u: { return select(0.0, 1.0, x >= y); }
    case 23u: { return select(0.0, 1.0, x < y); }
    case 24u: { return select(0.0, 1.0, x <= y); }
    case 25u: { return select(0.0, 1.0, x != y); }
    case 30u: { return select(z, y, x != 0.0); }  // where(a, b, c)
    case 40u: {  // gelu gate: (1 + tanh(c (x + a x^3))) / 2, in the numpy backend's order of operations
      let u = (x * x * (GELU_A * GELU_C) + GELU_C) * x;
      return stable_tanh(u) * 0.5 + 0.5;
    }
    case 41u: {  // gelu backward: gate (1 + 2 c x (1 - gate)(1 + 3 a x^2)) * grad, x = a, gate = b, grad = c
      let inner = ((x * x * (6.0 * GELU_A * GELU_C) + 2.0 * GELU_C) * x) * (1.0 - y) + 1.0;
      return inner * y * z;
    }
    default: { return x; }
  }
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
        @builtin(local_invocation_index) lid: u32) {
  let i = group_index(wid, nwg) * 256u + lid;
  if (i >= p[0]) { return; }
  var x = pf(48u);
  var y = pf(49u);
  var z = pf(50u);
  if (p[23u] == 0u) { x = a[element_offset(i, 0u)]; }
  if (p[31u] == 0u) { y = b[element_offset(i, 1u)]; }
  if (p[39u] == 0u) { z = c[element_offset(i, 2u)]; }
  out[element_offset(i, 3u)] = apply(p[1], x, y, z);
}
