// out[i] = x[index[i / width] * width + i % width]: rows of a table (embeddings) or single elements
// (width 1, general indexing). Params: [0] elements, [1] width.
@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read> index: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
        @builtin(local_invocation_index) lid: u32) {
  let i = group_index(wid, nwg) * 256u + lid;
  if (i >= p[0]) { return; }
  let width = p[1];
  out[i] = x[index[i / width] * width + i % width];
}
