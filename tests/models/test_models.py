"""The bundled models: shapes, gradients, a short training run, normalisation choices and argument checks."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_asyncfl.evaluation import evaluate
from lit_asyncfl.models import (
    VGG11,
    AlexNet,
    LeNet5,
    LinearRegression,
    LinearSVM,
    ResNet20,
    TextCNN,
)

NUM_CLASSES = 4


def _images(channels: int, side: int) -> Callable[[int], Tensor]:
    return lambda n: torch.randn(n, channels, side, side)


def _tokens(length: int, vocab: int = 50) -> Callable[[int], Tensor]:
    return lambda n: torch.randint(1, vocab, (n, length))


# name -> (small model, input maker, SGD steps in the training test). The training hyper-parameters memorise 8 random
# samples reliably (checked over several seeds); unnormalised ResNet-20 starts with identity residual branches and
# needs more, smaller steps.
CASES: dict[str, tuple[Callable[[], nn.Module], Callable[[int], Tensor], int]] = {
    "resnet20-batch": (lambda: ResNet20(NUM_CLASSES, lr=0.01, momentum=0.9), _images(3, 16), 30),
    "resnet20-group": (lambda: ResNet20(NUM_CLASSES, norm="group", lr=0.01, momentum=0.9), _images(3, 16), 30),
    "resnet20-none": (lambda: ResNet20(NUM_CLASSES, norm="none", lr=0.005, momentum=0.9), _images(3, 16), 60),
    "vgg11-batch": (lambda: VGG11(NUM_CLASSES, width=0.125, lr=0.01, momentum=0.9), _images(3, 32), 30),
    "vgg11-group": (lambda: VGG11(NUM_CLASSES, width=0.125, norm="group", lr=0.01, momentum=0.9), _images(3, 32), 30),
    "vgg11-none": (lambda: VGG11(NUM_CLASSES, width=0.125, norm="none", lr=0.005, momentum=0.9), _images(3, 32), 30),
    "alexnet": (lambda: AlexNet(NUM_CLASSES, width=0.125, dropout=0.0, lr=0.01, momentum=0.9), _images(3, 32), 30),
    "textcnn": (
        lambda: TextCNN(50, embed_dim=16, num_filters=8, dropout=0.0, num_classes=NUM_CLASSES, lr=0.02, momentum=0.9),
        _tokens(20),
        30,
    ),
    "linear-svm": (lambda: LinearSVM(input_dim=12, num_classes=NUM_CLASSES, lr=0.05), _images(3, 2), 30),
    "lenet5": (lambda: LeNet5(NUM_CLASSES, lr=0.1, momentum=0.9), _images(1, 8), 30),
}


pytestmark = pytest.mark.usefixtures("one_thread")  # these models are tiny


def _quiet(model: nn.Module) -> nn.Module:
    """Drop ``self.log`` calls (outside a Trainer they only warn)."""
    model.log = lambda *args, **kwargs: None  # type: ignore[method-assign]
    return model


@pytest.mark.parametrize(
    ("model", "x", "expected"),
    [
        pytest.param(lambda: ResNet20(), (2, 3, 32, 32), (2, 10), id="resnet20-cifar"),
        pytest.param(lambda: ResNet20(in_channels=1, norm="group"), (2, 1, 28, 28), (2, 10), id="resnet20-mnist"),
        pytest.param(lambda: ResNet20(num_classes=3, norm="none"), (2, 3, 8, 8), (2, 3), id="resnet20-8x8"),
        pytest.param(lambda: VGG11(width=0.25), (2, 3, 32, 32), (2, 10), id="vgg11-cifar"),
        pytest.param(lambda: VGG11(in_channels=1, input_size=64, width=0.125), (2, 1, 64, 64), (2, 10), id="vgg11-64"),
        pytest.param(lambda: AlexNet(width=0.25), (2, 3, 32, 32), (2, 10), id="alexnet-cifar"),
        pytest.param(lambda: AlexNet(in_channels=1, input_size=28, width=0.25), (2, 1, 28, 28), (2, 10), id="alex-28"),
        pytest.param(lambda: LinearSVM(input_dim=12, num_classes=3), (5, 3, 2, 2), (5, 3), id="linear-svm"),
        pytest.param(lambda: LinearRegression(input_dim=13), (5, 13), (5,), id="linear-regression"),
    ],
)
def test_forward_shape(model: Callable[[], nn.Module], x: tuple[int, ...], expected: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    assert model()(torch.randn(*x)).shape == expected


@pytest.mark.parametrize("length", [20, 5, 2, 1])
def test_textcnn_forward_shape_any_length(length: int) -> None:
    torch.manual_seed(0)
    model = TextCNN(vocab_size=50, embed_dim=16, num_filters=8, kernel_sizes=(3, 4, 5))
    assert model(torch.randint(0, 50, (4, length))).shape == (4, 2)


def test_textcnn_short_sequence_is_padded_with_padding_tokens() -> None:
    """A length-2 sequence scores as the same sequence padded by hand to the largest kernel."""
    torch.manual_seed(0)
    model = TextCNN(vocab_size=50, embed_dim=16, num_filters=8, padding_idx=0).eval()
    short = torch.tensor([[7, 9]])
    assert torch.allclose(model(short), model(torch.tensor([[7, 9, 0, 0, 0]])))


@pytest.mark.parametrize("name", sorted(CASES))
def test_backward_gives_finite_gradients(name: str) -> None:
    torch.manual_seed(0)
    factory, inputs, _ = CASES[name]
    model = factory()
    logits = model(inputs(4))
    logits.logsumexp(dim=1).sum().backward()  # a loss touching every logit (so every parameter)
    for pname, p in model.named_parameters():
        assert p.grad is not None, pname
        assert torch.isfinite(p.grad).all(), pname


@pytest.mark.parametrize("name", sorted(CASES))
def test_short_training_lowers_the_loss(name: str) -> None:
    """A few dozen SGD steps of the module's own ``training_step``/``configure_optimizers`` on one fixed batch."""
    torch.manual_seed(0)
    factory, inputs, steps = CASES[name]
    model = _quiet(factory())
    batch = [inputs(8), torch.arange(8) % NUM_CLASSES]
    optimizer = model.configure_optimizers()
    model.train()
    losses = []
    for step in range(steps):
        optimizer.zero_grad()
        loss = model.training_step(batch, step)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    with torch.no_grad():
        final = model.training_step(batch, steps).item()
    assert torch.isfinite(torch.tensor(losses)).all()
    assert final < 0.5 * losses[0], (losses[0], final)


@pytest.mark.parametrize("cls", [ResNet20, VGG11])
def test_group_norm_has_no_batch_norm_and_no_buffers(cls: type) -> None:
    kwargs = {"width": 0.125} if cls is VGG11 else {}
    grouped = cls(norm="group", **kwargs)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in grouped.modules())
    assert any(isinstance(m, nn.GroupNorm) for m in grouped.modules())
    assert list(grouped.buffers()) == []
    batched = cls(norm="batch", **kwargs)
    assert any(isinstance(m, nn.BatchNorm2d) for m in batched.modules())
    assert list(batched.buffers())
    plain = cls(norm="none", **kwargs)
    assert not any(isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)) for m in plain.modules())
    assert list(plain.buffers()) == []


def test_resnet20_has_the_papers_size() -> None:
    """Option-A shortcuts have no parameters: ResNet-20 has about 0.27M parameters (He et al., Table 6)."""
    n = sum(p.numel() for p in ResNet20(norm="batch").parameters())
    assert 265_000 < n < 275_000


@pytest.mark.parametrize(
    ("factory", "pattern"),
    [
        pytest.param(lambda: ResNet20(norm="layer"), r"norm.*'layer'", id="resnet-norm"),
        pytest.param(lambda: ResNet20(norm="group", groups=3), r"groups.*3", id="resnet-groups"),
        pytest.param(lambda: ResNet20(in_channels=0), r"in_channels.*0", id="resnet-in-channels"),
        pytest.param(lambda: VGG11(norm="instance"), r"norm.*'instance'", id="vgg-norm"),
        pytest.param(lambda: VGG11(input_size=28), r"input_size.*28", id="vgg-input-size"),
        pytest.param(lambda: VGG11(width=-1.0), r"width.*-1", id="vgg-width"),
        pytest.param(lambda: AlexNet(input_size=8), r"input_size.*8", id="alexnet-input-size"),
        pytest.param(lambda: AlexNet(dropout=1.5), r"dropout.*1.5", id="alexnet-dropout"),
        pytest.param(lambda: TextCNN(vocab_size=0), r"vocab_size.*0", id="textcnn-vocab"),
        pytest.param(lambda: TextCNN(vocab_size=10, kernel_sizes=()), r"kernel_sizes.*\[\]", id="textcnn-kernels"),
        pytest.param(lambda: TextCNN(vocab_size=10, padding_idx=10), r"padding_idx.*10", id="textcnn-padding"),
        pytest.param(lambda: LinearRegression(input_dim=0), r"input_dim.*0", id="regression-input-dim"),
        pytest.param(lambda: LinearSVM(input_dim=2, margin=0.0), r"margin.*0", id="svm-margin"),
        pytest.param(lambda: LinearSVM(input_dim=2, num_classes=1), r"num_classes.*1", id="svm-classes"),
    ],
)
def test_bad_arguments_raise(factory: Callable[[], nn.Module], pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        factory()


def test_textcnn_rejects_non_2d_input() -> None:
    with pytest.raises(ValueError, match=r"\(3, 4, 5\)"):
        TextCNN(vocab_size=10)(torch.zeros(3, 4, 5, dtype=torch.long))


def _r2(pred: Tensor, y: Tensor) -> float:
    ss_res = ((y - pred) ** 2).sum()
    ss_tot = ((y - y.mean()) ** 2).sum()
    return float(1 - ss_res / ss_tot)


def test_linear_regression_fits_noise_free_data_and_logs_set_wide_r2() -> None:
    torch.manual_seed(0)
    x = torch.randn(64, 5)
    y = x @ torch.tensor([1.5, -2.0, 0.5, 3.0, -1.0]) + 0.7
    model = _quiet(LinearRegression(input_dim=5, lr=0.1))
    optimizer = model.configure_optimizers()
    first = None
    for step in range(60):
        optimizer.zero_grad()
        loss = model.training_step([x, y], step)
        first = loss.item() if first is None else first
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        pred = model(x)
    assert loss.item() < 0.05 * first
    # uneven batches, one of a single sample: logged values must still be the whole-set ones
    batches = [[x[:1], y[:1]], [x[1:40], y[1:40]], [x[40:], y[40:]]]
    out = evaluate(model, batches, stage="val")
    assert sorted(out) == ["val_loss", "val_mae", "val_r2"]
    assert out["val_r2"] > 0.9
    assert out["val_r2"] == pytest.approx(_r2(pred, y), abs=1e-5)
    assert out["val_loss"] == pytest.approx(float(F.mse_loss(pred, y)), rel=1e-4, abs=1e-8)
    assert out["val_mae"] == pytest.approx(float((pred - y).abs().mean()), rel=1e-4, abs=1e-8)
    # the R^2 state is reset after each evaluation, and the test stage has its own
    assert evaluate(model, batches, stage="val")["val_r2"] == pytest.approx(out["val_r2"], abs=1e-6)
    assert evaluate(model, batches, stage="test")["test_r2"] == pytest.approx(out["val_r2"], abs=1e-6)


def test_linear_regression_r2_of_a_single_sample_is_nan() -> None:
    out = evaluate(LinearRegression(input_dim=3), [[torch.randn(1, 3), torch.randn(1)]])
    assert torch.isnan(torch.tensor(out["val_r2"]))


def test_linear_regression_has_no_parameters_besides_the_linear_layer() -> None:
    """The R^2 metrics hold no parameters or buffers, so federated averaging sees only w and b."""
    model = LinearRegression(input_dim=4)
    assert [name for name, _ in model.named_parameters()] == ["linear.weight", "linear.bias"]
    assert list(model.buffers()) == []


@pytest.mark.parametrize(
    ("margin", "expected"),
    [
        # sample 0: class 0, max(0, m - 2 + (-1)); sample 1: class 1, max(0, m - 0.5 + 0.3); each / 2 classes
        (1.0, (0.0 + 0.8) / 2 / 2),
        (2.0, (0.0 + 1.8) / 2 / 2),
        (4.0, (1.0 + 3.8) / 2 / 2),
    ],
)
def test_linear_svm_hinge_loss_matches_hand_computation(margin: float, expected: float) -> None:
    svm = LinearSVM(input_dim=2, margin=margin)
    scores = torch.tensor([[2.0, -1.0], [0.3, 0.5]])
    labels = torch.tensor([0, 1])
    assert svm.loss(scores, labels).item() == pytest.approx(expected)


def test_linear_svm_three_class_hinge_and_logged_loss() -> None:
    torch.manual_seed(0)
    svm = LinearSVM(input_dim=4, num_classes=3)
    scores = torch.tensor([[1.0, 0.5, -0.2]])
    # class 0: max(0, 1 - 1 + 0.5) + max(0, 1 - 1 - 0.2) = 0.5, over 3 classes
    assert svm.loss(scores, torch.tensor([0])).item() == pytest.approx(0.5 / 3)
    x, y = torch.randn(6, 4), torch.tensor([0, 1, 2, 0, 1, 2])
    out = evaluate(svm, [[x, y]])
    with torch.no_grad():
        assert out["val_loss"] == pytest.approx(float(F.multi_margin_loss(svm(x), y)), rel=1e-6)


def test_linear_svm_separates_a_separable_toy_set() -> None:
    torch.manual_seed(0)
    x = torch.cat([torch.randn(20, 2) * 0.5 + 2.0, torch.randn(20, 2) * 0.5 - 2.0])
    y = torch.cat([torch.ones(20, dtype=torch.long), torch.zeros(20, dtype=torch.long)])
    svm = _quiet(LinearSVM(input_dim=2, lr=0.1))
    optimizer = svm.configure_optimizers()
    for step in range(100):
        optimizer.zero_grad()
        svm.training_step([x, y], step).backward()
        optimizer.step()
    out = evaluate(svm, [[x, y]])
    assert out["val_acc"] == 1.0
    assert out["val_loss"] < 0.05


def test_classification_module_loss_is_still_cross_entropy() -> None:
    """The ``loss`` hook refactor leaves the existing models' training and evaluation loss unchanged."""
    torch.manual_seed(0)
    model = _quiet(LeNet5())
    x, y = torch.randn(6, 1, 8, 8), torch.tensor([0, 1, 2, 3, 4, 5])
    with torch.no_grad():
        reference = F.cross_entropy(model(x), y)
        assert torch.equal(model.loss(model(x), y), reference)
        assert torch.equal(model.training_step([x, y], 0), reference)
    assert evaluate(model, [[x, y]], stage="test")["test_loss"] == pytest.approx(reference.item(), rel=1e-6)
