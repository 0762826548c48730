"""rot6d -> rotation matrix -> axis-angle, the way the Cosmos3 LIBERO recipe decodes rotations.

The model emits a *column-based* 6-D rotation: ``r[0:3]`` is the first column of the rotation
matrix and ``r[3:6]`` the second. The network's output is only approximately orthonormal, so the
matrix ``[c0, c1, c0 x c1]`` is projected onto SO(3) by SVD (the nearest rotation in Frobenius
norm), not by Gram-Schmidt, which would privilege the first column.
"""

from __future__ import annotations

import numpy as np
from scipy.spatial.transform import Rotation


def rot6d_to_matrix(rot6d: np.ndarray) -> np.ndarray:
    """Map ``[..., 6]`` column-based rot6d to ``[..., 3, 3]`` proper rotation matrices."""
    rot6d = np.asarray(rot6d, dtype=np.float64)
    if rot6d.ndim < 1 or rot6d.shape[-1] != 6:
        raise ValueError(f"rot6d must have shape [..., 6]; found {rot6d.shape}")
    col0, col1 = rot6d[..., 0:3], rot6d[..., 3:6]
    approx = np.stack([col0, col1, np.cross(col0, col1)], axis=-1)  # columns: [..., 3, 3]
    return project_to_so3(approx)


def project_to_so3(matrices: np.ndarray) -> np.ndarray:
    """The nearest proper rotation to each ``[..., 3, 3]`` matrix: ``U @ Vt``, det fixed to +1."""
    matrices = np.asarray(matrices, dtype=np.float64)
    if matrices.ndim < 2 or matrices.shape[-2:] != (3, 3):
        raise ValueError(f"matrices must have shape [..., 3, 3]; found {matrices.shape}")
    u, _, vt = np.linalg.svd(matrices.reshape(-1, 3, 3))  # [N, 3, 3] each
    # A reflection (det -1) is turned into a rotation by flipping U's last column, which
    # changes the product least (it pairs with the smallest singular value).
    flip = np.linalg.det(u @ vt) < 0
    u[flip, :, -1] *= -1
    return (u @ vt).reshape(matrices.shape)


def rot6d_to_axis_angle(rot6d: np.ndarray) -> np.ndarray:
    """Map ``[..., 6]`` column-based rot6d to ``[..., 3]`` axis-angle (rotation vectors)."""
    matrices = rot6d_to_matrix(rot6d)
    lead = matrices.shape[:-2]
    rotvec = Rotation.from_matrix(matrices.reshape(-1, 3, 3)).as_rotvec()
    return rotvec.reshape(*lead, 3)
