"""Reports on a quantized model: what each layer is, where it runs and why (explain.py), accuracy
against FP32 per layer and at the output (compare.py), and the accuracy-budgeted fallback that
keeps the most sensitive layers in FP32 (fallback.py)."""
from .compare import CompareResult, LayerReport, OutputReport, compare
from .explain import Explanation, explain
from .fallback import BudgetWarning, FallbackReport, quantize_within_budget

__all__ = ["explain", "Explanation", "compare", "CompareResult", "LayerReport", "OutputReport", "quantize_within_budget", "FallbackReport",
           "BudgetWarning"]
