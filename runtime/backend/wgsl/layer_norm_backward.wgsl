// dx of layer norm, one workgroup per row: dn = g * weight; dx = (dn - mean(dn) - n mean(dn n)) * rstd.
// Params: [0] rows, [1] width, [2] has weight.
@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read_write> dx: array<f32>;
@group(0) @binding(2) var<storage, read> normalized: array<f32>;
@group(0) @binding(3) var<storage, read> rstd: array<f32>;
@group(0) @binding(4) var<storage, read> weight: array<f32>;
@group(0) @binding(5) var<storage, read> g: array<f32>;

fn dn(base: u32, k: u32) -> f32 {
  if (p[2] == 1u) { return g[base + k] * weight[k]; }
  return g[base + k];
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
        @builtin(local_invocation_index) lid: u32) {
  let rows = p[0];
  let width = p[1];
  let row = group_index(wid, nwg);
  let r = min(row, rows - 1u);
  let base = r * width;
  let inverse_width = 1.0 / f32(width);
  var acc_projection = 0.0;
  var acc_mean = 0.0;
  for (var k = lid; k < width; k = k + WG) {
    let d = dn(base, k);
    acc_projection = acc_projection + d * normalized[base + k];
    acc_mean = acc_mean + d;
  }
  let projection = group_sum(acc_projection, lid) * inverse_width;
  let mean = group_sum(acc_mean, lid) * inverse_width;
  if (row < rows) {
    for (var k = lid; k < width; k = k + WG) {
      dx[base + k] = (dn(base, k) - mean - normalized[base + k] * projection) * rstd[r];
    }
  }
}
