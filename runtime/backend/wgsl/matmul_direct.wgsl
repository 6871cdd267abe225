// Batched C = A @ B without workgroup memory or barriers: each invocation walks K for one output. Same
// parameters as matmul.wgsl. On a software adapter (SwiftShader) workgroup barriers are costly and the
// CPU's caches already do what the tiles would, so the backend can pick this variant there.
@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> a: array<f32>;
@group(0) @binding(3) var<storage, read> b: array<f32>;

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wid: vec3u, @builtin(local_invocation_id) lid: vec3u) {
  let m = p[0];
  let n = p[1];
  let k = p[2];
  let row = wid.y * 16u + lid.y;
  let col = wid.x * 16u + lid.x;
  if (row >= m || col >= n) { return; }
  var rest = wid.z;
  var a_at = p[16] + row * p[17];
  var b_at = p[19] + col * p[21];
  for (var d = 0u; d < p[3]; d = d + 1u) {
    let axis = p[3] - 1u - d;
    let index = rest % p[4u + axis];
    rest = rest / p[4u + axis];
    a_at = a_at + index * p[8u + axis];
    b_at = b_at + index * p[12u + axis];
  }
  var acc = 0.0;
  for (var kk = 0u; kk < k; kk = kk + 1u) {
    acc = acc + a[a_at + kk * p[18]] * b[b_at + kk * p[20]];
  }
  out[wid.z * m * n + row * n + col] = acc;
}
