"""ONNX export of target + block drafter (ORT-GenAI lattice contract) and an onnxruntime backend."""
