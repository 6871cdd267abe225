// Layer norm over the last axis, one workgroup per row: y = normalized * weight + bias, also writing the
// normalized rows and 1/std for the backward pass. Params: [0] rows, [1] width, [2] has weight,
// [3] has bias, [4] eps.
@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<storage, read_write> normalized: array<f32>;
@group(0) @binding(3) var<storage, read_write> rstd: array<f32>;
@group(0) @binding(4) var<storage, read> x: array<f32>;
@group(0) @binding(5) var<storage, read> weight: array<f32>;
@group(0) @binding(6) var<storage, read> bias: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
        @builtin(local_invocation_index) lid: u32) {
  let rows = p[0];
  let width = p[1];
  let row = group_index(wid, nwg);
  let base = min(row, rows - 1u) * width;
  let inverse_width = 1.0 / f32(width);
  var acc = 0.0;
  for (var k = lid; k < width; k = k + WG) { acc = acc + x[base + k]; }
  let mean = group_sum(acc, lid) * inverse_width;
  acc = 0.0;
  for (var k = lid; k < width; k = k + WG) {
    let centered = x[base + k] - mean;
    acc = acc + centered * centered;
  }
  let r = 1.0 / sqrt(group_sum(acc, lid) * inverse_width + pf(4u));
  if (row < rows) {
    if (lid == 0u) { rstd[row] = r; }
    for (var k = lid; k < width; k = k + WG) {
      let n = (x[base + k] - mean) * r;
      normalized[base + k] = n;
      var v = n;
      if (p[2] == 1u) { v = v * weight[k]; }
      if (p[3] == 1u) { v = v + bias[k]; }
      y[base + k] = v;
    }
  }
}
