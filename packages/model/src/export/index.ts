export * from './hf-tokenizer';
export * from './model-folder';
export * from './onnx';
export * from './safetensors';
