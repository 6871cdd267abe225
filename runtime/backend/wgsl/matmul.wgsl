// Batched C = A @ B through 16x16 tiles in workgroup memory. A and B are strided views, so transposes and
// the q/k/v views of attention need no copy. C is contiguous (batch, M, N).
// Params: [0] M, [1] N, [2] K, [3] batch ndim (<= 4), [4..7] batch shape, [8..11] A batch strides,
// [12..15] B batch strides, [16] A offset, [17] A row stride, [18] A k stride, [19] B offset,
// [20] B k stride, [21] B column stride.
@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> a: array<f32>;
@group(0) @binding(3) var<storage, read> b: array<f32>;

const TILE: u32 = 16u;
var<workgroup> tile_a: array<array<f32, 16>, 16>;
var<workgroup> tile_b: array<array<f32, 16>, 16>;

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wid: vec3u, @builtin(local_invocation_id) lid: vec3u) {
  let m = p[0];
  let n = p[1];
  let k = p[2];
  let row = wid.y * TILE + lid.y;
  let col = wid.x * TILE + lid.x;
  var rest = wid.z;
  var a_base = p[16];
  var b_base = p[19];
  for (var d = 0u; d < p[3]; d = d + 1u) {
    let axis = p[3] - 1u - d;
    let index = rest % p[4u + axis];
    rest = rest / p[4u + axis];
    a_base = a_base + index * p[8u + axis];
    b_base = b_base + index * p[12u + axis];
  }
  var acc = 0.0;
  for (var t = 0u; t < k; t = t + TILE) {
    let ak = t + lid.x;
    var av = 0.0;
    if (row < m && ak < k) { av = a[a_base + row * p[17] + ak * p[18]]; }
    tile_a[lid.y][lid.x] = av;
    let bk = t + lid.y;
    var bv = 0.0;
    if (bk < k && col < n) { bv = b[b_base + bk * p[20] + col * p[21]]; }
    tile_b[lid.y][lid.x] = bv;
    workgroupBarrier();
    for (var kk = 0u; kk < TILE; kk = kk + 1u) {
      acc = acc + tile_a[lid.y][kk] * tile_b[kk][lid.x];
    }
    workgroupBarrier();
  }
  if (row < m && col < n) { out[wid.z * m * n + row * n + col] = acc; }
}
