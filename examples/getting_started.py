"""The getting-started example: two tensors added on the default backend and printed."""

import ember
from ember import Tensor


def main() -> None:
    device = ember.default_device()
    tensor_1 = Tensor.from_data([[2.0, 3.0], [4.0, 5.0]], device=device)
    tensor_2 = Tensor.ones_like(tensor_1)
    print(tensor_1 + tensor_2)


if __name__ == "__main__":
    main()
