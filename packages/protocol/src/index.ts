export * from './frames';
export * from './identity';
export * from './messages';
export * from './rewards';
export * from './dashboard';
export * from './stage-map';
export * from './traffic';
