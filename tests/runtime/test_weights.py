from __future__ import annotations

import hashlib
import json
from collections import OrderedDict

import numpy as np
import pytest

from runtime.weights import InvalidSpec, SpecMismatch, WeightSpec, flatten, spec_of, unflatten


def make_params() -> OrderedDict[str, np.ndarray]:
    return OrderedDict(
        [
            ("w", np.arange(6, dtype=np.float32).reshape(2, 3)),  # 0 1 2 / 3 4 5
            ("b", np.array([10.0, 11.0, 12.0], dtype=np.float32)),
            ("scale", np.array(7.0, dtype=np.float32)),  # a 0-d entry holds one value
        ]
    )


def test_spec_of_keeps_registration_order_and_sizes() -> None:
    spec = spec_of(make_params())
    assert spec.names == ("w", "b", "scale")
    assert spec.shapes == ((2, 3), (3,), ())
    assert spec.offsets == (0, 6, 9, 10)
    assert spec.size == 10
    assert spec.dtype == "float32"


def test_flatten_concatenates_in_spec_order() -> None:
    params = make_params()
    vector = flatten(params, spec_of(params))
    assert vector.dtype == np.float32 and vector.shape == (10,)
    np.testing.assert_array_equal(vector, [0, 1, 2, 3, 4, 5, 10, 11, 12, 7])


def test_flatten_follows_the_spec_not_the_mapping_order() -> None:
    params = make_params()
    spec = spec_of(params)
    reordered = {"scale": params["scale"], "b": params["b"], "w": params["w"]}
    np.testing.assert_array_equal(flatten(reordered, spec), [0, 1, 2, 3, 4, 5, 10, 11, 12, 7])


def test_flatten_casts_float64_to_float32() -> None:
    spec = WeightSpec((("x", (2,)),))
    vector = flatten({"x": np.array([0.5, 1.5], dtype=np.float64)}, spec)
    assert vector.dtype == np.float32
    np.testing.assert_array_equal(vector, [0.5, 1.5])


def test_unflatten_round_trip_and_views() -> None:
    params = make_params()
    spec = spec_of(params)
    vector = flatten(params, spec)
    arrays = unflatten(vector, spec)
    assert list(arrays) == ["w", "b", "scale"]
    for name in params:
        assert arrays[name].shape == params[name].shape
        assert arrays[name].dtype == np.float32
        np.testing.assert_array_equal(arrays[name], params[name])
    vector[0] = 99.0  # views: the change shows through
    assert arrays["w"][0, 0] == 99.0


def test_unflatten_copy_is_independent() -> None:
    spec = spec_of(make_params())
    vector = flatten(make_params(), spec)
    arrays = unflatten(vector, spec, copy=True)
    vector[0] = 99.0
    assert arrays["w"][0, 0] == 0.0


def test_spec_json_round_trip() -> None:
    spec = spec_of(make_params())
    text = json.dumps(spec.to_json())
    assert json.loads(text) == {"names": ["w", "b", "scale"], "shapes": [[2, 3], [3], []], "dtype": "float32"}
    assert WeightSpec.from_json(json.loads(text)) == spec


def test_fingerprint_is_short_sha256_of_canonical_json() -> None:
    spec = WeightSpec((("w", (2, 3)), ("b", (3,))))
    # canonical JSON: sorted keys, no spaces
    canonical = b'{"dtype":"float32","names":["w","b"],"shapes":[[2,3],[3]]}'
    assert spec.fingerprint() == hashlib.sha256(canonical).hexdigest()[:16]
    assert WeightSpec((("w", (2, 3)), ("b", (3,)))).fingerprint() == spec.fingerprint()
    assert WeightSpec((("b", (3,)), ("w", (2, 3)))).fingerprint() != spec.fingerprint()
    assert WeightSpec((("w", (3, 2)), ("b", (3,)))).fingerprint() != spec.fingerprint()


def test_entry_at_maps_flat_index_to_name() -> None:
    spec = spec_of(make_params())
    assert [spec.entry_at(i) for i in (0, 5, 6, 8, 9)] == ["w", "w", "b", "b", "scale"]
    with pytest.raises(IndexError):
        spec.entry_at(10)


def test_first_difference_names_the_entry() -> None:
    spec = WeightSpec((("w", (2, 3)), ("b", (3,))))
    assert spec.first_difference(spec) is None
    assert "'b'" in str(spec.first_difference(WeightSpec((("w", (2, 3)), ("b", (4,))))))
    assert "2 entries" in str(spec.first_difference(WeightSpec((("w", (2, 3)),))))


def test_flatten_missing_entry_is_named() -> None:
    params = make_params()
    spec = spec_of(params)
    del params["b"]
    with pytest.raises(SpecMismatch, match="missing entry 'b'"):
        flatten(params, spec)


def test_flatten_extra_entry_is_named() -> None:
    params = make_params()
    spec = spec_of(params)
    params["extra"] = np.zeros(2, dtype=np.float32)
    with pytest.raises(SpecMismatch, match="'extra'"):
        flatten(params, spec)


def test_flatten_wrong_shape_is_named() -> None:
    params = make_params()
    spec = spec_of(params)
    params["w"] = np.zeros((3, 2), dtype=np.float32)  # same size, different shape: no silent reshape
    with pytest.raises(SpecMismatch, match=r"'w' has shape \[3, 2\], spec says \[2, 3\]"):
        flatten(params, spec)


def test_flatten_refuses_non_numbers() -> None:
    spec = WeightSpec((("x", (1,)),))
    with pytest.raises(SpecMismatch, match="'x' has dtype"):
        flatten({"x": np.array(["a"])}, spec)


def test_unflatten_rejects_wrong_length_and_rank() -> None:
    spec = spec_of(make_params())
    with pytest.raises(SpecMismatch, match="9 values, spec needs 10"):
        unflatten(np.zeros(9, dtype=np.float32), spec)
    with pytest.raises(SpecMismatch, match="1-D"):
        unflatten(np.zeros((2, 5), dtype=np.float32), spec)


@pytest.mark.parametrize(
    "entries, message",
    [
        ((("w", (2,)), ("w", (3,))), "appears twice"),
        ((("w", (-1,)),), "dimension -1"),
        ((("w", (True,)),), "dimension True"),
        ((("", (2,)),), "non-empty string"),
        ((("w", 2),), "not a sequence"),
        ((("w",),), "not a \\(name, shape\\) pair"),
    ],
)
def test_invalid_specs_are_refused(entries: tuple, message: str) -> None:
    with pytest.raises(InvalidSpec, match=message):
        WeightSpec(entries)


@pytest.mark.parametrize(
    "data, message",
    [
        ({"names": ["w"], "shapes": [[2]], "dtype": "float64"}, "only 'float32'"),
        ({"names": ["w"], "shapes": [[2]]}, "missing dtype"),
        ({"names": ["w", "b"], "shapes": [[2]], "dtype": "float32"}, "2 names but 1 shapes"),
        ({"names": "w", "shapes": [[2]], "dtype": "float32"}, "JSON arrays"),
        ({"names": ["w"], "shapes": [2], "dtype": "float32"}, "not a JSON array"),
    ],
)
def test_invalid_spec_json_is_refused(data: dict, message: str) -> None:
    with pytest.raises(InvalidSpec, match=message):
        WeightSpec.from_json(data)
