export { colorWanted, type RenderOptions, renderAnswer } from './render.js';
export { ask } from './session.js';
