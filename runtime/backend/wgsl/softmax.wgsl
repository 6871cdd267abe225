// Row softmax / log-softmax over the last axis, one 64-invocation workgroup per row.
// Params: [0] rows, [1] width, [2] mode (0 softmax, 1 log_softmax, 2 causal attention: x * scale, columns
// after the row's position (row % length) masked out), [3] scale, [4] length.
@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
        @builtin(local_invocation_index) lid: u32) {
  let rows = p[0];
  let width = p[1];
  let mode = p[2];
  let row = group_index(wid, nwg);
  let base = min(row, rows - 1u) * width;
  var scale = 1.0;
  var limit = width;
  if (mode == 2u) {
    scale = pf(3u);
    limit = min(row, rows - 1u) % p[4] + 1u;
  }
  var best = -3.402823e38;
  for (var k = lid; k < limit; k = k + WG) { best = max(best, x[base + k] * scale); }
  best = group_max(best, lid);
  var total = 0.0;
  for (var k = lid; k < limit; k = k + WG) { total = total + exp(x[base + k] * scale - best); }
  total = group_sum(total, lid);
  if (row < rows) {
    for (var k = lid; k < width; k = k + WG) {
      let z = x[base + k] * scale - best;
      if (mode == 1u) {
        out[base + k] = z - log(total);
      } else if (k < limit) {
        out[base + k] = exp(z) / total;
      } else {
        out[base + k] = 0.0;
      }
    }
  }
}
