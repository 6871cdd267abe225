// Sum / max / sum of squares over any set of axes of a strided view; one 64-invocation workgroup per output.
// Params: [0] outputs, [1] reduced count, [2] op (0 sum, 1 max, 2 sum of squares), [3] offset,
// [4] kept ndim, [5..10] kept shape, [11..16] kept strides, [17] reduced ndim, [18..23] reduced shape,
// [24..29] reduced strides.
@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;

fn strided(index: u32, ndim: u32, shape_at: u32, strides_at: u32) -> u32 {
  var rest = index;
  var offset = 0u;
  for (var d = 0u; d < ndim; d = d + 1u) {
    let axis = ndim - 1u - d;
    let size = p[shape_at + axis];
    offset = offset + (rest % size) * p[strides_at + axis];
    rest = rest / size;
  }
  return offset;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
        @builtin(local_invocation_index) lid: u32) {
  let outputs = p[0];
  let count = p[1];
  let op = p[2];
  let m = group_index(wid, nwg);
  let base = p[3] + strided(min(m, outputs - 1u), p[4], 5u, 11u);
  var acc = 0.0;
  if (op == 1u) { acc = -3.402823e38; }
  for (var k = lid; k < count; k = k + WG) {
    let v = x[base + strided(k, p[17], 18u, 24u)];
    if (op == 0u) { acc = acc + v; } else if (op == 1u) { acc = max(acc, v); } else { acc = acc + v * v; }
  }
  // Both reductions run so that the barriers stay in uniform control flow.
  let summed = group_sum(acc, lid);
  let best = group_max(acc, lid);
  let total = select(summed, best, op == 1u);
  if (lid == 0u && m < outputs) { out[m] = total; }
}
