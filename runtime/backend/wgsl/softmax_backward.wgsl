// Backward of the row softmax (mode 0: dx = (g - sum(g y)) y * scale) and log-softmax
// (mode 1: dx = g - exp(y) sum(g)). Params: [0] rows, [1] width, [2] mode, [3] scale.
@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> y: array<f32>;
@group(0) @binding(3) var<storage, read> g: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
        @builtin(local_invocation_index) lid: u32) {
  let rows = p[0];
  let width = p[1];
  let mode = p[2];
  let scale = pf(3u);
  let row = group_index(wid, nwg);
  let base = min(row, rows - 1u) * width;
  var acc = 0.0;
  for (var k = lid; k < width; k = k + WG) {
    if (mode == 0u) { acc = acc + g[base + k] * y[base + k]; } else { acc = acc + g[base + k]; }
  }
  let total = group_sum(acc, lid);
  if (row < rows) {
    for (var k = lid; k < width; k = k + WG) {
      if (mode == 0u) {
        out[base + k] = (g[base + k] - total) * y[base + k] * scale;
      } else {
        out[base + k] = g[base + k] - exp(y[base + k]) * total;
      }
    }
  }
}
