/** The Try page and its worker: what each says to the other. */
export type ToTryWorker =
  | { cmd: 'load'; url: string; memoryBytes: number }
  | { cmd: 'generate'; prompt: string; temperature: number; topK: number; maxTokens: number; seed: number };

export type FromTryWorker =
  | { ev: 'loading'; done: number; total: number; what: string }
  | { ev: 'ready'; rounds: number[]; heldOutLoss: number | null; parameters: number; backend: string; preset: string; stages: number; codec: string }
  | { ev: 'too-large'; needBytes: number; haveBytes: number; parameters: number; preset: string }
  | { ev: 'text'; text: string; tokens: number; ms: number }
  | { ev: 'done'; tokens: number; ms: number }
  | { ev: 'error'; message: string };
