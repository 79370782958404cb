"""SGLang on a CPU (or XPU) verifies every sampled speculative request greedily: a standalone reproduction.

Reads the installed sglang's own source (nothing of specwatch): ``srt/speculative/eagle_utils.py`` and
``srt/arg_groups/speculative_hook.py``. ``eagle_utils`` cannot be imported without the engine's dependencies
(torchvision among them), so ``_verify_uses_greedy`` (a pure function of its arguments) is compiled alone from the
file, and ``eagle_sample``'s branch is printed from the source.

    pip install --no-deps --target /tmp/sglang-0.5.23 sglang==0.5.23
    python docs/repro/sglang_cpu_greedy_verification.py /tmp/sglang-0.5.23

(or with no argument, the ``sglang`` importable here). Prints what it finds; exits 1 when the fallback is present.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import torch


def package_dir(argv: list[str]) -> Path:
    if len(argv) > 1:
        return Path(argv[1]) / "sglang"
    spec = importlib.util.find_spec("sglang")
    if spec is None or spec.origin is None:
        sys.exit("sglang not found: pass the folder it is installed in")
    return Path(spec.origin).parent


def function(path: Path, name: str):  # noqa: ANN201 - the release's own function
    tree = ast.parse(path.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    namespace: dict[str, object] = {}
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), namespace)  # noqa: S102
    return namespace[name], ast.get_source_segment(path.read_text(), node)


def main(argv: list[str]) -> int:
    root = package_dir(argv)
    eagle = root / "srt" / "speculative" / "eagle_utils.py"
    hook = root / "srt" / "arg_groups" / "speculative_hook.py"
    uses_greedy, source = function(eagle, "_verify_uses_greedy")
    print(f"{eagle}:\n{source.splitlines()[-1].strip()}\n")
    print("_verify_uses_greedy for a sampled request (is_all_greedy=False):")
    platforms = {"CUDA": {}, "ROCm": {"is_hip": True}, "CPU": {"is_cpu": True}, "XPU": {"is_xpu": True}}
    greedy_on_cpu = False
    for name, flags in platforms.items():
        for rejection in (False, True):
            args = {"is_all_greedy": False, "is_cpu": False, "is_hip": False, "is_xpu": False, "use_rejection_sampling": rejection, **flags}
            greedy = uses_greedy(**args)
            greedy_on_cpu |= greedy and name == "CPU"
            print(f"  {name:5} speculative_use_rejection_sampling={rejection!s:5} -> {'GREEDY (argmax)' if greedy else 'sampled'}")
    text = eagle.read_text().splitlines()
    start = next(i for i, line in enumerate(text) if "if _verify_uses_greedy(" in line)
    argmax = next(i for i in range(start, start + 20) if "torch.argmax(next_token_logits" in text[i])
    print(f"\neagle_sample, {eagle.name}:{start + 1}-{argmax + 1}: the greedy branch commits the target's argmax")
    print("\n".join(f"  {i + 1:4}  {text[i]}" for i in range(start, argmax + 1)))
    auto, auto_source = function(hook, "_should_auto_enable_hip_rejection_sampling")
    print(f"\n{hook.name}: rejection sampling is switched on by default only on ROCm:")
    body = auto_source.splitlines()
    start_return = next(i for i, line in enumerate(body) if line.strip().startswith("return"))
    print("\n".join(f"  {line}" for line in body[start_return : start_return + 4]))
    common = {"use_rejection_sampling": False, "algorithm": "EAGLE", "token_map": None, "eagle_topk": 1}
    common |= {"accept_threshold_single": 1.0, "accept_threshold_acc": 1.0, "enable_deterministic_inference": False}
    print(
        f"  EAGLE topk 1 on ROCm: {auto(is_hip=True, **common)}; on a CPU or XPU the hook is not consulted (is_hip False): {auto(is_hip=False, **common)}"
    )

    # What a sampled request gets on a CPU: the argmax instead of a draw from p (temperature 1, no top-k/top-p).
    p = torch.tensor([0.5, 0.3, 0.2])
    emitted = torch.zeros(3)
    emitted[p.argmax()] = 1.0
    print(
        f"\nconsequence: target law p = {p.tolist()}; the emitted token's law on a CPU = {emitted.tolist()}; TV = {0.5 * float((p - emitted).abs().sum()):.2f}"
    )

    def patched(*, is_all_greedy: bool, is_cpu: bool, is_hip: bool, is_xpu: bool, use_rejection_sampling: bool) -> bool:
        return is_all_greedy or ((is_cpu or is_xpu or is_hip) and not use_rejection_sampling)

    cpu = {"is_all_greedy": False, "is_cpu": True, "is_hip": False, "is_xpu": False}
    print(
        "patch (ROCm's way): _verify_uses_greedy = is_all_greedy or ((is_cpu or is_xpu or is_hip) and not use_rejection_sampling), "
        f"and rejection sampling on by default there: CPU with it -> {'greedy' if patched(**cpu, use_rejection_sampling=True) else 'sampled'}, "
        f"without -> {'greedy' if patched(**cpu, use_rejection_sampling=False) else 'sampled'}"
    )
    print("FALLBACK PRESENT: sampled requests are verified greedily on CPU" if greedy_on_cpu else "no CPU fallback in this release")
    return 1 if greedy_on_cpu else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
