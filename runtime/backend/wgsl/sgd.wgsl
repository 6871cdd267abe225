// torch.optim.SGD for one parameter, in place. Params: [0] n, [1] flags (1 momentum, 2 first step: the
// buffer starts as the direction, 4 nesterov, 8 weight decay), [2] lr, [3] momentum, [4] 1 - dampening,
// [5] weight decay.
@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read_write> param: array<f32>;
@group(0) @binding(2) var<storage, read_write> buffer: array<f32>;
@group(0) @binding(3) var<storage, read> grad: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
        @builtin(local_invocation_index) lid: u32) {
  let i = group_index(wid, nwg) * 256u + lid;
  if (i >= p[0]) { return; }
  let flags = p[1];
  var direction = grad[i];
  if ((flags & 8u) != 0u) { direction = direction + pf(5u) * param[i]; }
  if ((flags & 1u) != 0u) {
    var v = direction;
    if ((flags & 2u) == 0u) { v = buffer[i] * pf(3u) + pf(4u) * direction; }
    buffer[i] = v;
    if ((flags & 4u) != 0u) { direction = direction + pf(3u) * v; } else { direction = v; }
  }
  param[i] = param[i] - pf(2u) * direction;
}
