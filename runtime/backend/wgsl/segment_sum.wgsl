// Scatter-add without atomics: the host sorts the destinations, so out row r sums the source rows
// order[start[r] .. start[r + 1]] in a fixed order (deterministic, like the numpy backend's reduceat).
// Params: [0] elements (rows * width), [1] width.
@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> src: array<f32>;
@group(0) @binding(3) var<storage, read> start: array<u32>;
@group(0) @binding(4) var<storage, read> order: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
        @builtin(local_invocation_index) lid: u32) {
  let i = group_index(wid, nwg) * 256u + lid;
  if (i >= p[0]) { return; }
  let width = p[1];
  let row = i / width;
  let col = i % width;
  var acc = 0.0;
  for (var j = start[row]; j < start[row + 1u]; j = j + 1u) { acc = acc + src[order[j] * width + col]; }
  out[i] = acc;
}
