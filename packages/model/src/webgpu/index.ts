/**
 * `@train-at-home/model/webgpu`: the boundary codec's int8 quantize and
 * dequantize as WGSL kernels for tfjs-backend-webgpu. Browser only, and kept
 * out of the package's main index so Node never loads it. Register and select
 * the backend first (`import '@tensorflow/tfjs-backend-webgpu'`,
 * `await tf.setBackend('webgpu')`); every function here throws
 * WebGPUBackendRequiredError otherwise.
 *
 * Packed layout, exactness (tolerance 0) and the tie table: ./programs.ts.
 */
export { DequantizeRowsProgram, QuantizeRowsProgram, packedRowWords, tieTableWGSL } from './programs';
export {
  WebGPUBackendRequiredError,
  codesFromFrame,
  decodeToTensorGPU,
  dequantizeRowsGPU,
  encodeBoundaryGPU,
  frameFromCodes,
  quantizeRowsGPU,
  requireWebGPUBackend,
} from './codec-gpu';
export { codecCheckData, codecKernelCheck, type CodecKernelCheck } from './check';
export { ADAMW_CONSTANTS, SUM_INPUTS, SUM_PARTIALS, SumSquaresProgram, adamwProgram, clipProgram } from './optim-programs';
export { adamwReference, fusedAdamWGPU, optimizerKernelCheck, useFusedOptimizer, type OptimizerKernelCheck } from './optim-gpu';
export { countGpuWork, type GpuCounter, type GpuCounts } from './counters';
export { SUBMIT_EVERY_DISPATCHES, useSteadyStateWebGPU, useWriteBufferUploads } from './steady-state';
export { layerNormGradGBProgram, layerNormGradXProgram, layerNormProgram } from './layernorm-programs';
export { multiProgramCode, multiPrograms, type MultiProgram } from './multi-program';
export { attentionGradProgram, attentionProgram, attentionKernelCheck, fusedAttentionGPU, useFusedAttention } from './attention';
export { fusedLayerNormGPU, layerNormKernelCheck, useFusedLayerNorm } from './layernorm';
export { checkFusedOp, type FusedKernelCheck } from './fused-check';
export { GeluGradProgram, GeluProgram, fusedGeluGPU, geluKernelCheck, useFusedGelu } from './gelu';
export { matMulAddGPU, matMulGPU, matMulKernelCheck, matMulTransposedGPU, useTransposedMatMul } from './matmul';
export { addLayerNormGradProgram, addLayerNormKernelCheck, addLayerNormProgram, fusedAddLayerNormGPU, useFusedAddLayerNorm } from './add-layernorm';
